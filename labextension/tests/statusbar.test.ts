// The status-bar item's words and colour, from replies shaped as the server sends them.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { parseMetrics, parseSettings, parseStatus, statusView } from '../src/model';

const GIB = 2 ** 30;
const TEN_MIN = 600;

function device(index: number, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { index, name: 'NVIDIA H200', uuid: `GPU-${index}`, utilization_gpu: 40 + index, memory_used: 20 * GIB,
    memory_total: 140 * GIB, ...extra };
}

function holder(kernelId: string, devices: Array<[number, number]>, idle: number | null): Record<string, unknown> {
  return { kind: 'kernel', label: 'train.ipynb', summary: `train.ipynb holds memory on GPU ${devices[0][0]}`,
    memory: devices.reduce((sum, [, bytes]) => sum + bytes, 0), devices: devices.map(([index, memory]) => ({ index, memory })),
    kernel_id: kernelId, paths: ['train.ipynb'], execution_state: idle === null ? 'busy' : 'idle',
    state: idle === null ? 'busy 1 min' : `idle ${idle} s`, idle_seconds: idle };
}

function metrics(devices: unknown[], holders: unknown[] = []) {
  return parseMetrics({ api_version: 1, interval: 1, error: null, history: [], alerts: [], holders,
    latest: { timestamp: 100, backend: 'nvml', simulated: false, status: 'ok', devices } });
}

test('the kernel in focus: its GPU, how busy, and the memory it holds out of the total', () => {
  const view = statusView(metrics([device(0), device(4)], [holder('k1', [[4, 12.3 * GIB]], 30)]), null, false, 'k1', TEN_MIN);
  assert.equal(view.text, 'GPU 4 · 44 % · 12.3 GiB / 140.0 GiB');
  assert.equal(view.level, 'ok');
  assert.match(view.tooltip, /^train\.ipynb holds memory on GPU 4\n/);
});

test('a kernel on two GPUs: both, utilisation averaged, memory summed over both totals', () => {
  const view = statusView(metrics([device(0), device(1), device(2)], [holder('k1', [[0, GIB], [2, GIB]], null)]), null,
    false, 'k1', TEN_MIN);
  assert.equal(view.text, 'GPU 0,2 · 41 % · 2.0 GiB / 280.0 GiB');
});

test('MIG boards report no utilisation: n/a, never 0 %', () => {
  const view = statusView(metrics([device(0, { utilization_gpu: null })], [holder('k1', [[0, GIB]], 5)]), null, false, 'k1', TEN_MIN);
  assert.equal(view.text, 'GPU 0 · n/a · 1.0 GiB / 140.0 GiB');
});

test('a notebook whose kernel holds no GPU memory, or no notebook in focus: GPU none, and why', () => {
  const reply = metrics([device(0), device(1)], [holder('other', [[0, GIB]], 5)]);
  const notHeld = statusView(reply, null, false, 'k1', TEN_MIN);
  assert.equal(notHeld.text, 'GPU: none');
  assert.equal(notHeld.level, 'none');
  assert.match(notHeld.tooltip, /kernel holds no GPU memory/);
  assert.match(notHeld.tooltip, /This server has 2 GPUs/);
  assert.match(statusView(reply, null, false, null, TEN_MIN).tooltip, /^No notebook is in focus\./);
});

test('no GPU on the server: GPU none with NVML reason and the check verdict as the tooltip', () => {
  const reply = parseMetrics({ api_version: 1, interval: 1, error: null, history: [], alerts: [], holders: [],
    latest: { timestamp: 1, backend: 'nvml', simulated: false, status: 'no_driver', message: 'NVML Shared Library Not Found', devices: [] } });
  const status = parseStatus({ available: false, status: 'no_driver', reason: 'NVML Shared Library Not Found', devices: [],
    check: { status: 'fail', verdict: 'PyTorch cannot use a GPU here', headline: null, fix: ['install the driver'], code: 'X' } });
  const view = statusView(reply, status, false, 'k1', TEN_MIN);
  assert.deepEqual([view.text, view.level], ['GPU: none', 'none']);
  assert.match(view.tooltip, /^NVML Shared Library Not Found\nPyTorch cannot use a GPU here\n/);
});

test('amber: the kernel has held memory idle past the threshold, or its GPU is nearly full', () => {
  const idle = statusView(metrics([device(0)], [holder('k1', [[0, 3 * GIB]], 601)]), null, false, 'k1', TEN_MIN);
  assert.equal(idle.level, 'warn');
  assert.match(idle.tooltip, /Idle 10 min while holding 3\.0 GiB of GPU memory: %gpumem .* --free NAME/);
  assert.equal(statusView(metrics([device(0)], [holder('k1', [[0, 3 * GIB]], 599)]), null, false, 'k1', TEN_MIN).level, 'ok');
  const busy = statusView(metrics([device(0)], [holder('k1', [[0, 3 * GIB]], null)]), null, false, 'k1', 0);
  assert.equal(busy.level, 'ok', 'a kernel running a cell is never idle');
  const full = statusView(metrics([device(0, { memory_used: 135 * GIB })], [holder('k1', [[0, 3 * GIB]], 5)]), null, false, 'k1', TEN_MIN);
  assert.equal(full.level, 'warn');
  assert.match(full.tooltip, /GPU 0 memory is nearly full \(135\.0 GiB \/ 140\.0 GiB\)/);
});

test('red: a lost GPU, whatever the notebook in focus', () => {
  const lost = device(0, { status: 'lost', error: 'NVML reports GPU 0 is lost (GPU is lost): it fell off the bus.' });
  const view = statusView(metrics([lost, device(1)]), null, false, null, TEN_MIN);
  assert.deepEqual([view.text, view.level], ['GPU 0 lost', 'fail']);
  assert.match(view.tooltip, /fell off the bus/);
});

test('before the first reply, and when the server cannot be reached', () => {
  assert.equal(statusView(null, null, false, 'k1', TEN_MIN).level, 'loading');
  assert.deepEqual(statusView(null, null, true, 'k1', TEN_MIN).text, 'GPU: ?');
});

test('the idle threshold is a setting in minutes, 10 by default, 0 allowed, never negative', () => {
  assert.equal(parseSettings({}).idleWarningMinutes, 10);
  assert.equal(parseSettings({ idleWarningMinutes: 0 }).idleWarningMinutes, 0);
  assert.equal(parseSettings({ idleWarningMinutes: -1 }).idleWarningMinutes, 10);
});

test('red: every GPU is held by another process in exclusive-process mode, so this notebook cannot use one', () => {
  const taken = device(0, { compute_mode: 'exclusive_process', processes: [{ pid: 999, memory_used: GIB }] });
  const view = statusView(metrics([taken]), null, false, 'k1', TEN_MIN);
  assert.deepEqual([view.text, view.level], ['GPU 0 taken', 'fail']);
  assert.match(view.tooltip, /^GPU 0 is held by another process in exclusive-process mode/);
  // One GPU of two taken: the other is free, so no red; the tooltip still names the taken one.
  const oneOfTwo = statusView(metrics([taken, device(1, { compute_mode: 'default' })]), null, false, 'k1', TEN_MIN);
  assert.equal(oneOfTwo.level, 'none');
  assert.match(oneOfTwo.tooltip, /GPU 0 is held by another process in exclusive-process mode/);
  // Exclusive mode with nobody on it yet is open; the kernel holding it itself is its own GPU, shown as usual.
  const free = device(0, { compute_mode: 'exclusive_process', processes: [] });
  assert.equal(statusView(metrics([free]), null, false, 'k1', TEN_MIN).level, 'none');
  const mine = statusView(metrics([taken], [holder('k1', [[0, GIB]], 5)]), null, false, 'k1', TEN_MIN);
  assert.equal(mine.level, 'ok');
});
