// Formatting helpers: the same text as jupyter_gpu.units (values checked against the Python functions).
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

test('formatBytes matches jupyter_gpu.units.format_bytes', () => {
  const cases: Array<[number, string]> = [
    [0, '0 B'],
    [1, '1 B'],
    [1023, '1023 B'],
    [1024, '1.0 KiB'],
    [1536, '1.5 KiB'],
    [629145600, '600.0 MiB'],
    [22000000000, '20.5 GiB'],
    [79662415872, '74.2 GiB'],
    [85899345920, '80.0 GiB'],
    [21743271936, '20.2 GiB'], // exactly 20.25 GiB: Python rounds the tie to even
    [22280142848, '20.8 GiB'], // exactly 20.75 GiB
    [3298534883328, '3.0 TiB'],
    [-2048, '-2.0 KiB'],
    [1099468678103.04, '1024.0 GiB']
  ];
  for (const [value, expected] of cases) {
    assert.equal(formatBytes(value), expected, `formatBytes(${value})`);
  }
});

test('a missing reading is "n/a", never 0', () => {
  assert.equal(formatBytes(null), 'n/a');
  assert.equal(formatBytes(undefined), 'n/a');
  assert.equal(formatBytes(NaN), 'n/a');
  assert.equal(formatPercent(null), 'n/a');
  assert.equal(formatMemory(null, 85899345920), 'n/a');
  assert.equal(formatPower(null, 400), 'n/a');
  assert.equal(formatTemperature(null), 'n/a');
  assert.equal(formatClock(null), 'n/a');
  assert.equal(formatDuration(null), 'n/a');
});

test('formatDuration matches jupyter_gpu.units.format_duration', () => {
  const cases: Array<[number, string]> = [
    [0, '0 s'],
    [0.5, '0 s'],
    [1.5, '2 s'],
    [2.5, '2 s'],
    [89.4, '89 s'],
    [124, '2 min'],
    [5399, '90 min'],
    [5400, '1.5 h'],
    [9000, '2.5 h'],
    [10804, '3 h'],
    [33300, '9.2 h'],
    [35999, '10 h'],
    [36000, '10 h'],
    [172799, '48 h'],
    [172800, '2 d'],
    [216000, '2 d']
  ];
  for (const [value, expected] of cases) {
    assert.equal(formatDuration(value), expected, `formatDuration(${value})`);
  }
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
