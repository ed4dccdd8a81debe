// The push stream's URL and how pushed frames join into one reply.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { ServerConnection } from '@jupyterlab/services';

import { joinFrames, parseMetrics } from '../src/model';
import { streamUrl } from '../src/stream';

function settings(overrides: Partial<ServerConnection.ISettings>): ServerConnection.ISettings {
  return ServerConnection.makeSettings({
    baseUrl: 'http://example.org/user/alice/',
    wsUrl: 'ws://example.org/user/alice/',
    token: 'secret',
    appendToken: false,
    ...overrides
  });
}

function frame(history: number[], latest: number | null, holders: string[] = []): unknown {
  const sample = (timestamp: number) => ({ timestamp, devices: [] });
  return {
    api_version: 1,
    interval: 1,
    latest: latest === null ? null : sample(latest),
    history: history.map(sample),
    holders: holders.map(label => ({ label, kind: 'kernel', pids: [], memory: [] })),
    alerts: []
  };
}

test('the stream URL is under the WebSocket base URL, with since and every, and no token unless JupyterLab appends one', () => {
  assert.equal(
    streamUrl(settings({}), 1700000000.5, 2),
    'ws://example.org/user/alice/jupyter-gpu/api/metrics/stream?since=1700000000.5&every=2'
  );
  assert.equal(streamUrl(settings({})), 'ws://example.org/user/alice/jupyter-gpu/api/metrics/stream');
  assert.equal(
    streamUrl(settings({ appendToken: true })),
    'ws://example.org/user/alice/jupyter-gpu/api/metrics/stream?token=secret'
  );
  assert.equal(
    streamUrl(settings({ appendToken: true, token: '' })),
    'ws://example.org/user/alice/jupyter-gpu/api/metrics/stream'
  );
});

test('frames join into one reply carrying every reading once, in order, with the last frame\'s holders', () => {
  const joined = joinFrames([frame([1, 2], 3, ['a']), frame([], 4, ['b']), frame([5], 6, ['c'])].map(parseMetrics));
  assert.deepEqual(
    joined.history.map(s => s.timestamp),
    [1, 2, 3, 4, 5]
  );
  assert.equal(joined.latest?.timestamp, 6);
  assert.deepEqual(
    joined.holders.map(h => h.label),
    ['c']
  );
});

test('one frame joins to itself, and no frame is an error', () => {
  const one = parseMetrics(frame([7], 8));
  assert.deepEqual(joinFrames([one]), one);
  assert.throws(() => joinFrames([]), /no frame/);
});
