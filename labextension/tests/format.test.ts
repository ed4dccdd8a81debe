// Formatting helpers: the same text as jupyter_gpu.rendering.units. formatBytes and formatDuration are checked against
// the Python functions' golden text in format-golden.test.ts; the other helpers here.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  formatBytes,
  formatClock,
  formatDuration,
  formatMemory,
  formatPercent,
  formatPower,
  formatTemperature,
  pyFixed
} from '../src/format';

test('a missing reading is "n/a", never 0', () => {
  // null is in the golden cases (format-golden.test.ts); undefined, NaN and infinities are not JSON.
  assert.equal(formatBytes(undefined), 'n/a');
  assert.equal(formatBytes(NaN), 'n/a');
  assert.equal(formatBytes(Infinity), 'n/a');
  assert.equal(formatPercent(null), 'n/a');
  assert.equal(formatMemory(null, 85899345920), 'n/a');
  assert.equal(formatPower(null, 400), 'n/a');
  assert.equal(formatTemperature(null), 'n/a');
  assert.equal(formatClock(null), 'n/a');
  assert.equal(formatDuration(undefined), 'n/a');
  assert.equal(formatDuration(NaN), 'n/a');
  assert.equal(formatDuration(-Infinity), 'n/a');
});

test('pyFixed rounds exact ties to even like Python, everything else like toFixed', () => {
  assert.equal(pyFixed(0.25, 1), '0.2');
  assert.equal(pyFixed(0.75, 1), '0.8');
  assert.equal(pyFixed(0.15, 1), '0.1'); // 0.15 is just below .15 in binary
  assert.equal(pyFixed(2.5, 0), '2');
  assert.equal(pyFixed(3.5, 0), '4');
  assert.equal(pyFixed(41.6, 0), '42');
});

test('gauges', () => {
  assert.equal(formatPercent(42), '42 %');
  assert.equal(formatPercent(99.6), '100 %');
  assert.equal(formatMemory(22000000000, 85899345920), '20.5 GiB / 80.0 GiB');
  assert.equal(formatMemory(22000000000, null), '20.5 GiB');
  assert.equal(formatPower(212.794, 400), '213 W / 400 W');
  assert.equal(formatPower(212.794, null), '213 W');
  assert.equal(formatTemperature(49), '49 °C');
  assert.equal(formatClock(1410), '1410 MHz');
});
