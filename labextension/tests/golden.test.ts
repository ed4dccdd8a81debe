// The panel's model against the server's golden reply (tests/fixtures/golden/metrics.json at the repo root).
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import * as path from 'node:path';
import { test } from 'node:test';

import { formatBytes } from '../src/format';
import {
  chartHistory,
  chartWindow,
  deviceIndices,
  deviceSeries,
  holderRows,
  mergeHistory,
  Metrics,
  metricsAvailability,
  panelState,
  parseMetrics,
  parseStatus,
  PayloadError,
  polylinePoints,
  Sample,
  sinceOf,
  unavailableView
} from '../src/model';

// Compiled to labextension/build-test/tests/: the repository root is three levels up.
const GOLDEN = path.resolve(__dirname, '..', '..', '..', 'tests', 'fixtures', 'golden', 'metrics.json');
const XSS = '<img src=x onerror=alert(1)>';

function raw(): Record<string, unknown> {
  return JSON.parse(readFileSync(GOLDEN, 'utf8'));
}

function golden(): Metrics {
  return parseMetrics(raw());
}

/** A copy of `sample` at another time. */
function at(sample: Sample, timestamp: number): Sample {
  return { ...sample, timestamp };
}

test('the golden reply parses: 8 A100s, simulated, with history, holders and alerts', () => {
  const metrics = golden();
  assert.equal(metrics.api_version, 1);
  assert.equal(metrics.backend, 'simulated:a100x8-mig');
  assert.equal(metrics.simulated, true);
  assert.equal(metrics.interval, 1);
  assert.equal(metrics.error, null);
  assert.ok(metrics.latest);
  assert.equal(metrics.latest.timestamp, 1790000004);
  assert.equal(metrics.latest.devices.length, 8);
  assert.deepEqual(deviceIndices(metrics.latest), [0, 1, 2, 3, 4, 5, 6, 7]);
  for (const device of metrics.latest.devices) {
    assert.equal(device.name, 'NVIDIA A100-SXM4-80GB');
    assert.equal(device.memory_total, 85899345920);
  }
  // Each sample once: the history runs up to the latest, which comes on its own.
  assert.deepEqual(
    metrics.history.map(s => s.timestamp),
    [1790000002, 1790000003]
  );
  assert.equal(metrics.latest!.timestamp, 1790000004);
  assert.equal(metricsAvailability(metrics), 'ok');
  assert.equal(panelState(metrics, null, false), 'ok');
  assert.equal(panelState(metrics, null, true), 'error');
  assert.equal(panelState(null, null, false), 'loading');
});

test('unknown readings stay null: MIG boards report no utilisation', () => {
  const latest = golden().latest!;
  const [gpu0, gpu1, , , gpu4, , gpu6] = latest.devices;
  assert.equal(gpu0.mig_enabled, true);
  assert.equal(gpu0.utilization_gpu, null);
  assert.equal(gpu1.utilization_gpu, null);
  assert.equal(gpu0.mig_instances.length, 7);
  assert.deepEqual(
    gpu1.mig_instances.map(m => m.profile),
    ['4g.40gb', '3g.40gb']
  );
  assert.equal(gpu4.utilization_gpu, 1);
  assert.equal(gpu6.throttled, true);
  assert.deepEqual(gpu6.throttle_reasons, ['sw_power_cap']);
  assert.equal(gpu6.sm_clock_mhz, 1230);
  assert.equal(gpu0.torch_allocated, null);
});

test('per-GPU series skip null readings', () => {
  const metrics = golden();
  const history = chartHistory(metrics.history, metrics.latest);
  assert.equal(history.length, 3);
  assert.deepEqual(deviceSeries(history, 0, 'utilization'), []);
  assert.deepEqual(deviceSeries(history, 1, 'utilization'), []);
  const gpu4 = deviceSeries(history, 4, 'utilization');
  assert.equal(gpu4.length, 3);
  assert.deepEqual(
    gpu4.map(p => p.t),
    [1790000002, 1790000003, 1790000004]
  );
  assert.equal(gpu4[2].v, metrics.latest!.devices[4].utilization_gpu);
  // MIG boards still have memory: a memory line, as a percentage of the total.
  const memory0 = deviceSeries(history, 0, 'memory');
  assert.equal(memory0.length, 3);
  const last = metrics.latest!.devices[0];
  assert.ok(Math.abs(memory0[2].v - (100 * last.memory_used!) / last.memory_total!) < 1e-9);
  // A GPU that is not in the samples has no points.
  assert.deepEqual(deviceSeries(history, 42, 'memory'), []);
});

test('a null reading in one sample leaves a gap of one point, not a 0', () => {
  const metrics = golden();
  const history = [...metrics.history, metrics.latest!].map((s, i) =>
    i === 1 ? { ...s, devices: s.devices.map(d => (d.index === 4 ? { ...d, utilization_gpu: null } : d)) } : s
  );
  const points = deviceSeries(history, 4, 'utilization');
  assert.equal(points.length, 2);
  assert.ok(points.every(p => p.t !== history[1].timestamp));
  // A lost GPU draws nothing.
  const lost = history.map(s => ({ ...s, devices: s.devices.map(d => ({ ...d, status: 'lost' })) }));
  assert.deepEqual(deviceSeries(lost, 4, 'utilization'), []);
});

test('polyline points: one "x,y" pair per point, inside the box', () => {
  const metrics = golden();
  const history = chartHistory(metrics.history, metrics.latest);
  const window = chartWindow(history)!;
  // Three seconds of history still span the minimum window, ending at the newest sample.
  assert.equal(window.end, 1790000004);
  assert.equal(window.end - window.start, 60);
  const points = deviceSeries(history, 2, 'utilization');
  const text = polylinePoints(points, window, 100, 30);
  const pairs = text.split(' ');
  assert.equal(pairs.length, points.length);
  for (const pair of pairs) {
    const [x, y] = pair.split(',').map(Number);
    assert.ok(x >= 0 && x <= 100, pair);
    assert.ok(y >= 0 && y <= 30, pair);
  }
  assert.equal(pairs[pairs.length - 1].split(',')[0], '100');
  assert.equal(polylinePoints([], window, 100, 30), '');
});

test('history merging: since replies are appended, no duplicate timestamps, capped', () => {
  const metrics = golden();
  // What the panel merges from one reply: the history, then the latest sample.
  const base = [...metrics.history, metrics.latest!];
  let kept = mergeHistory([], base);
  assert.equal(sinceOf(kept, metrics.latest), 1790000004);

  // A reply to since=1790000004 with two new samples.
  const newer = [at(base[2], 1790000005), at(base[2], 1790000006)];
  kept = mergeHistory(kept, newer);
  assert.deepEqual(
    kept.map(s => s.timestamp),
    [1790000002, 1790000003, 1790000004, 1790000005, 1790000006]
  );
  assert.equal(sinceOf(kept, null), 1790000006);

  // An overlapping reply (the whole history again) adds nothing twice.
  kept = mergeHistory(kept, [...base, newer[1]]);
  assert.equal(kept.length, 5);
  assert.equal(new Set(kept.map(s => s.timestamp)).size, 5);

  // An empty reply (nothing new) keeps everything.
  assert.equal(mergeHistory(kept, []).length, 5);

  // Capped: only the newest are kept.
  const many = Array.from({ length: 700 }, (_, i) => at(base[0], 1790001000 + i));
  const capped = mergeHistory(kept, many, 600);
  assert.equal(capped.length, 600);
  assert.equal(capped[0].timestamp, 1790001100);
  assert.equal(capped[599].timestamp, 1790001699);

  // Out-of-order input comes back ordered.
  const shuffled = mergeHistory([], [base[2], base[0], base[1]]);
  assert.deepEqual(
    shuffled.map(s => s.timestamp),
    [1790000002, 1790000003, 1790000004]
  );
  assert.equal(sinceOf([], null), undefined);
});

test('holder rows: the server order, its summaries and labels verbatim', () => {
  const metrics = golden();
  const rows = holderRows(metrics.holders);
  assert.equal(rows.length, metrics.holders.length);
  assert.equal(rows.length, 10);
  assert.equal(new Set(rows.map(r => r.key)).size, rows.length, 'row keys are unique');

  const untitled = rows.find(r => r.label === 'Untitled3.ipynb');
  assert.ok(untitled);
  assert.equal(untitled.kind, 'kernel');
  assert.equal(untitled.summary, 'Untitled3.ipynb holds 20.5 GiB on GPU 4, idle for 3 h');
  assert.match(untitled.summary, /idle for 3 h/);
  assert.deepEqual(untitled.paths, ['Untitled3.ipynb']);
  assert.deepEqual(untitled.memory, [{ index: 4, text: 'GPU 4: 20.5 GiB' }]);
  assert.equal(untitled.state, 'idle 3 h');
  assert.equal(untitled.stateKind, 'idle');
  assert.equal(untitled.showSummary, true);
  assert.equal(untitled.key, 'kernel:0c0ffee0-aaaa-4bbb-8ccc-000000000001');

  const busy = rows.find(r => r.kind === 'kernel' && r.paths.some(p => p.includes(XSS)));
  assert.ok(busy);
  assert.equal(busy.label, `experiments/${XSS}.ipynb`);
  assert.deepEqual(busy.paths, [`experiments/${XSS}.ipynb`]);
  assert.equal(busy.summary, `experiments/${XSS}.ipynb holds 7.5 GiB on GPU 4, busy for 2 min`);
  assert.equal(busy.state, 'busy 2 min');
  assert.equal(busy.stateKind, 'busy');

  const process = rows.find(r => r.kind === 'process');
  assert.ok(process);
  assert.equal(process.label, XSS);
  assert.equal(process.pid, 6000);
  assert.deepEqual(process.paths, []);
  assert.equal(process.state, null);

  const others = rows.filter(r => r.kind === 'other');
  assert.equal(others.length, 7); // one row per GPU for other users' processes
  assert.deepEqual(
    others.map(o => o.label),
    ['other process', 'other process', 'other process', 'other process', '2 other processes',
      '4 other processes', '2 other processes']
  );
  for (const other of others) {
    assert.equal(other.showSummary, false);
    assert.deepEqual(other.paths, []);
    assert.equal(other.pid, null);
    assert.equal(other.state, null);
  }
  // Notebooks first, then the user's own processes, then everyone else's, as the server sorted them.
  assert.deepEqual(rows.map(r => r.kind).slice(0, 4), ['kernel', 'kernel', 'process', 'other']);
  assert.equal(rows[3].total, '74.2 GiB');
  assert.deepEqual(rows[3].memory, [{ index: 5, text: 'GPU 5: 74.2 GiB' }]);
});

test('alerts are the server\'s, unchanged', () => {
  const metrics = golden();
  assert.deepEqual(
    metrics.alerts.map(a => a.code),
    ['MEMORY_NEARLY_FULL', 'THROTTLED', 'GPU_IDLE_DURING_CELL']
  );
  assert.deepEqual(
    metrics.alerts.map(a => a.severity),
    ['warn', 'warn', 'warn']
  );
  assert.deepEqual(
    metrics.alerts.map(a => a.device),
    [5, 6, 4]
  );
  assert.ok(metrics.alerts[2].message.startsWith(`experiments/${XSS}.ipynb: GPU 4 is 1% busy`));
  assert.equal(
    metrics.alerts[0].message,
    'GPU 5 memory is 93% full (74.2 GiB of 80.0 GiB): the next allocation may fail with out of memory.'
  );
});

test('byte formatting of golden values reads like the server summaries', () => {
  const metrics = golden();
  const holder = metrics.holders.find(h => h.label === 'Untitled3.ipynb')!;
  assert.equal(formatBytes(holder.memory), '20.5 GiB');
  assert.ok(holder.summary.includes(formatBytes(holder.memory)));
  for (const h of metrics.holders) {
    for (const d of h.devices) {
      assert.ok(h.summary.includes(`${formatBytes(d.memory)} on GPU ${d.index}`), h.summary);
    }
  }
  assert.equal(formatBytes(metrics.latest!.devices[0].memory_total), '80.0 GiB');
});

/** A /status reply of a machine without a driver, with `%gpucheck`'s brief as `check` (changed by `check`). */
function noDriverStatus(check: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    api_version: 1,
    interval: 1.0,
    sampler_threads: 1,
    backend: 'simulated:nodriver',
    simulated: true,
    available: false,
    status: 'no_driver',
    reason: 'NVML Shared Library Not Found',
    devices: [],
    check: {
      status: 'fail',
      verdict: 'No NVIDIA driver: this machine cannot use a GPU.',
      headline: 'The NVIDIA driver is not installed',
      fix: ['sudo apt install nvidia-driver-550', 'sudo reboot'],
      code: 'NO_DRIVER',
      ...check
    }
  };
}

/** The golden reply as a machine without a driver sends it: no devices, the sample's message says why. */
function noDriverMetrics(): Metrics {
  return parseMetrics({
    ...raw(),
    backend: 'simulated:nodriver',
    latest: {
      timestamp: 1790000010,
      backend: 'simulated:nodriver',
      simulated: true,
      status: 'no_driver',
      message: 'NVML Shared Library Not Found',
      devices: []
    },
    history: [],
    holders: [],
    alerts: []
  });
}

test('no GPU: the status reply gives the reason, the verdict and the fix', () => {
  const status = parseStatus(noDriverStatus());
  assert.equal(status.available, false);
  assert.equal(status.status, 'no_driver');
  assert.equal(status.check?.code, 'NO_DRIVER');

  const metrics = noDriverMetrics();
  assert.equal(metricsAvailability(metrics), 'unavailable');
  assert.equal(panelState(metrics, status, false), 'unavailable');
  const view = unavailableView(metrics, status);
  assert.equal(view.reason, 'NVML Shared Library Not Found');
  assert.equal(view.verdict, 'No NVIDIA driver: this machine cannot use a GPU.');
  assert.equal(view.fix, 'sudo apt install nvidia-driver-550\nsudo reboot');
  assert.equal(view.checkStatus, 'fail');
  assert.equal(view.headline, 'The NVIDIA driver is not installed');

  // Before /status answers, the sample's own message is the reason.
  assert.equal(unavailableView(metrics, null).reason, 'NVML Shared Library Not Found');
  assert.equal(unavailableView(metrics, null).fix, '');
});

test('the check\'s headline is shown as the server gives it: the panel has no rule of its own', () => {
  // The server's one brief (GpuCheckReport.brief) decides whether the headline adds to the verdict. Even a
  // headline the verdict contains, which the server would have sent as null, is shown as given.
  const status = parseStatus(
    noDriverStatus({
      verdict: 'PyTorch runs on the CPU: this container has no GPU.',
      headline: 'This container has no GPU.'
    })
  );
  assert.equal(status.check?.headline, 'This container has no GPU.');
  const view = unavailableView(noDriverMetrics(), status);
  assert.equal(view.verdict, 'PyTorch runs on the CPU: this container has no GPU.');
  assert.equal(view.headline, 'This container has no GPU.');
  assert.equal(view.fix, 'sudo apt install nvidia-driver-550\nsudo reboot');
});

test('a null headline (the verdict already says it) shows no headline; the verdict and the fix stay', () => {
  const status = parseStatus(noDriverStatus({ headline: null }));
  assert.equal(status.check?.headline, null);
  const view = unavailableView(noDriverMetrics(), status);
  assert.equal(view.headline, null);
  assert.equal(view.verdict, 'No NVIDIA driver: this machine cannot use a GPU.');
  assert.equal(view.fix, 'sudo apt install nvidia-driver-550\nsudo reboot');
  assert.equal(view.checkStatus, 'fail');
  assert.equal(view.reason, 'NVML Shared Library Not Found');
});

test('starting: no reading yet is "loading", not "unavailable"', () => {
  const metrics = parseMetrics({ ...raw(), latest: null, history: [], holders: [], alerts: [] });
  assert.equal(metricsAvailability(metrics), 'starting');
  const starting = parseStatus({
    api_version: 1,
    available: false,
    status: 'starting',
    reason: 'The first reading is on its way.',
    devices: [],
    check: null
  });
  assert.equal(panelState(metrics, starting, false), 'loading');
  assert.equal(panelState(metrics, null, false), 'loading');
  // A sampler that could not start is "unavailable", with the server's error as the reason.
  const broken = parseMetrics({ ...raw(), error: 'The GPU sampler could not start: ValueError: bad backend', latest: null });
  assert.equal(panelState(broken, null, false), 'unavailable');
  assert.equal(unavailableView(broken, null).reason, 'The GPU sampler could not start: ValueError: bad backend');
});

test('a reply that is not the API is refused, a newer API version too', () => {
  assert.throws(() => parseMetrics('<html>login</html>'), PayloadError);
  assert.throws(() => parseMetrics({ detail: 'nope' }), PayloadError);
  assert.throws(() => parseMetrics({ ...raw(), api_version: 2 }), /version 2/);
  assert.throws(() => parseStatus({ api_version: 1 }), PayloadError);
});

test('holder rows: kernels idle past the warning come first, each with how to give the memory back', () => {
  const metrics = golden();
  const byServer = holderRows(metrics.holders);
  const idleFirst = holderRows(metrics.holders, 600);
  assert.deepEqual(new Set(idleFirst.map(r => r.key)), new Set(byServer.map(r => r.key)), 'nothing dropped');
  const idleKernels = metrics.holders.filter(h => h.kind === 'kernel' && h.idle_seconds !== null && h.idle_seconds >= 600);
  assert.ok(idleKernels.length >= 1);
  assert.deepEqual(
    idleFirst.slice(0, idleKernels.length).map(r => r.label),
    idleKernels.map(h => h.label),
    'the idle kernels first, in the server order'
  );
  assert.match(idleFirst[0].hint ?? '', /%gpumem --free NAME gives it back; or shut its kernel down/);
  assert.ok(idleFirst.slice(idleKernels.length).every(r => r.hint === null));
  assert.ok(byServer.every(r => r.hint === null), 'no warning threshold, no hint');
});
