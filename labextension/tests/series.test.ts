// The chart windows: the last minute or ten from the kept readings, the last hour from the server's buckets.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { parseSeries, pointsIn, recentWindow, parseSample, seriesChart, windowSeconds } from '../src/model';

test('a reply of the server becomes a band per GPU and metric, points at the middle of their buckets', () => {
  const series = parseSeries({
    start: 1000, end: 1036, bucket_seconds: 12, t: [1000, 1012, 1024],
    devices: [
      { index: 0, utilization: { min: [null, null, null], mean: [null, null, null], max: [null, null, null] },
        memory: { min: [10, 12, 20], mean: [11, 15, 25], max: [12, 18, 130] } },
      { index: 1, utilization: { min: [1, 2], mean: [1, 2], max: [1, 2] } }
    ]
  });
  assert.deepEqual(seriesChart(series, 0, 'utilization'), { points: [], low: [], high: [] }, 'a MIG board: no line');
  const memory = seriesChart(series, 0, 'memory');
  assert.deepEqual(memory.points, [{ t: 1006, v: 11 }, { t: 1018, v: 15 }, { t: 1030, v: 25 }]);
  assert.deepEqual(memory.low.map(p => p.v), [10, 12, 20]);
  assert.deepEqual(memory.high.map(p => p.v), [12, 18, 100], 'clamped to the chart');
  // Two values for three buckets: not trusted, drawn as gaps rather than in the wrong place.
  assert.deepEqual(seriesChart(series, 1, 'utilization').points, []);
  assert.deepEqual(seriesChart(series, 7, 'memory').points, [], 'a GPU the reply does not have');
  assert.throws(() => parseSeries('nope'), /not an object/);
});

test('the short windows end at the newest reading and leave out what is older', () => {
  const history = [0, 30, 61, 90].map(t => parseSample({ timestamp: 1000 + t, devices: [] })!);
  const window = recentWindow(history, windowSeconds('1m'))!;
  assert.deepEqual(window, { start: 1030, end: 1090 });
  const points = [0, 30, 61, 90].map(t => ({ t: 1000 + t, v: 1 }));
  assert.deepEqual(pointsIn(points, window).map(p => p.t), [1030, 1061, 1090]);
  assert.equal(recentWindow([], 60), null);
  assert.deepEqual([windowSeconds('1m'), windowSeconds('10m'), windowSeconds('1h')], [60, 600, 3600]);
});
