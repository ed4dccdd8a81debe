// Parsing odd input, settings, poll interval.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { DEFAULT_SETTINGS, parseDevice, parseSample, parseSettings, pollInterval } from '../src/model';

test('a metric of the wrong type becomes null, not 0', () => {
  const device = parseDevice({ index: 3, name: 'X', utilization_gpu: 'high', memory_used: null, power_w: Infinity });
  assert.equal(device.index, 3);
  assert.equal(device.utilization_gpu, null);
  assert.equal(device.memory_used, null);
  assert.equal(device.power_w, null);
  assert.equal(device.throttled, false);
  assert.equal(device.throttle_reasons, null);
  assert.equal(device.processes, null);
  assert.deepEqual(device.mig_instances, []);
  assert.equal(device.status, 'ok');
});

test('a sample without a timestamp is dropped', () => {
  assert.equal(parseSample({ devices: [] }), null);
  assert.equal(parseSample(null), null);
  assert.equal(parseSample({ timestamp: 5, devices: [{ index: 0 }] })?.devices.length, 1);
});

test('settings: defaults for what is missing or wrong', () => {
  assert.deepEqual(parseSettings(undefined), DEFAULT_SETTINGS);
  assert.deepEqual(parseSettings({ refreshInterval: 0.1, showHolders: 'no' }), DEFAULT_SETTINGS);
  assert.deepEqual(parseSettings({ refreshInterval: 2.5, showMemory: false }), {
    ...DEFAULT_SETTINGS,
    refreshInterval: 2.5,
    showMemory: false
  });
});

test('the poll never runs faster than the server samples', () => {
  assert.equal(pollInterval(1, 1), 1000);
  assert.equal(pollInterval(0.5, 2), 2000);
  assert.equal(pollInterval(5, 1), 5000);
  assert.equal(pollInterval(0.5, null), 500);
  assert.equal(pollInterval(0.1, null), 1000);
});
