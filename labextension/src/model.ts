/**
 * The panel's data: the server's JSON parsed into typed objects, the history kept between polls, and
 * what each view shows, derived from them.
 *
 * Pure: no DOM, no JupyterLab import (compiled and tested under plain Node). Rules about GPUs (alerts,
 * who holds memory, "idle for 3 h") are the server's: this module only reshapes what it sends.
 */

import { formatBytes, formatDuration, formatMemory, formatPercent, formatSpan } from './format';

export const API_VERSION = 1;
/** Samples the panel keeps: the server keeps 600 by default. */
export const HISTORY_CAP = 600;
/** A chart always spans at least this much time, so a fresh server does not stretch three points. */
export const MIN_CHART_SPAN_S = 60;

// -- the server's JSON ---------------------------------------------------------------------------------

export interface MigInstance {
  index: number | null;
  uuid: string;
  profile: string;
  gpu_instance_id: number | null;
  memory_used: number | null;
  memory_total: number | null;
}

export interface GpuProcess {
  pid: number | null;
  memory_used: number | null;
  gpu_instance_id: number | null;
}

export type DeviceStatus = 'ok' | 'lost' | 'error' | string;

export interface Device {
  index: number;
  name: string;
  uuid: string;
  status: DeviceStatus;
  error: string | null;
  utilization_gpu: number | null;
  utilization_memory: number | null;
  memory_used: number | null;
  memory_total: number | null;
  temperature_c: number | null;
  power_w: number | null;
  power_limit_w: number | null;
  sm_clock_mhz: number | null;
  throttle_reasons: string[] | null;
  throttled: boolean;
  pcie_tx_bytes_per_s: number | null;
  pcie_rx_bytes_per_s: number | null;
  mig_enabled: boolean | null;
  mig_instances: MigInstance[];
  processes: GpuProcess[] | null;
  torch_allocated: number | null;
  torch_reserved: number | null;
  /** NVML's compute mode: 'default', 'exclusive_process', 'prohibited'; null when unknown. */
  compute_mode: string | null;
}

export type SampleStatus = 'ok' | 'no_driver' | 'error' | string;

export interface Sample {
  timestamp: number;
  backend: string | null;
  simulated: boolean | null;
  status: SampleStatus;
  message: string | null;
  devices: Device[];
}

export interface HolderDevice {
  index: number;
  memory: number | null;
}

export type HolderKind = 'kernel' | 'process' | 'other' | string;

export interface Holder {
  kind: HolderKind;
  label: string;
  summary: string;
  memory: number | null;
  devices: HolderDevice[];
  pid: number | null;
  kernel_id: string | null;
  kernel_name: string | null;
  paths: string[];
  execution_state: string | null;
  /** The server's words for the kernel's state: "idle 3 h", "busy 12 min", "starting". */
  state: string | null;
  idle_seconds: number | null;
  busy_seconds: number | null;
}

export type Severity = 'warn' | 'fail' | string;

export interface Alert {
  code: string;
  severity: Severity;
  device: number | null;
  message: string;
}

export interface Metrics {
  api_version: number | null;
  server_time: number | null;
  interval: number | null;
  backend: string | null;
  simulated: boolean | null;
  error: string | null;
  latest: Sample | null;
  history: Sample[];
  holders: Holder[];
  alerts: Alert[];
}

/** `%gpucheck`'s brief in the /status reply: the verdict, the headline (null when the verdict says it), the fix. */
export interface Check {
  status: 'ok' | 'warn' | 'fail' | string;
  verdict: string;
  /** Shown as given: the server already leaves it null when the verdict says the same thing. */
  headline: string | null;
  fix: string[];
  code: string | null;
}

export interface Status {
  api_version: number | null;
  interval: number | null;
  sampler_threads: number | null;
  backend: string | null;
  simulated: boolean | null;
  available: boolean;
  status: 'ok' | 'no_driver' | 'error' | 'starting' | string;
  reason: string | null;
  devices: Array<{ index: number; name: string; uuid: string; status: string }>;
  check: Check | null;
}

/** A reply that is not what the API sends (a proxy's HTML page, a newer incompatible server). */
export class PayloadError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PayloadError';
  }
}

// -- parsing: every field checked, a missing or odd metric becomes null (shown "n/a", never 0) ----------

type Json = Record<string, unknown>;

function isObject(value: unknown): value is Json {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function num(value: unknown): number | null {
  return typeof value === 'number' && Number.isFinite(value) ? value : null;
}

function str(value: unknown): string | null {
  return typeof value === 'string' ? value : null;
}

function bool(value: unknown): boolean | null {
  return typeof value === 'boolean' ? value : null;
}

function list(value: unknown): unknown[] {
  return Array.isArray(value) ? value : [];
}

function objects(value: unknown): Json[] {
  return list(value).filter(isObject);
}

function parseMig(data: Json): MigInstance {
  return {
    index: num(data.index),
    uuid: str(data.uuid) ?? '',
    profile: str(data.profile) ?? '',
    gpu_instance_id: num(data.gpu_instance_id),
    memory_used: num(data.memory_used),
    memory_total: num(data.memory_total)
  };
}

export function parseDevice(data: Json, position = 0): Device {
  const reasons = Array.isArray(data.throttle_reasons)
    ? data.throttle_reasons.filter((r): r is string => typeof r === 'string')
    : null;
  const processes = Array.isArray(data.processes)
    ? objects(data.processes).map(p => ({
        pid: num(p.pid),
        memory_used: num(p.memory_used),
        gpu_instance_id: num(p.gpu_instance_id)
      }))
    : null;
  return {
    index: num(data.index) ?? position,
    name: str(data.name) ?? '',
    uuid: str(data.uuid) ?? '',
    status: str(data.status) ?? 'ok',
    error: str(data.error),
    utilization_gpu: num(data.utilization_gpu),
    utilization_memory: num(data.utilization_memory),
    memory_used: num(data.memory_used),
    memory_total: num(data.memory_total),
    temperature_c: num(data.temperature_c),
    power_w: num(data.power_w),
    power_limit_w: num(data.power_limit_w),
    sm_clock_mhz: num(data.sm_clock_mhz),
    throttle_reasons: reasons,
    throttled: data.throttled === true,
    pcie_tx_bytes_per_s: num(data.pcie_tx_bytes_per_s),
    pcie_rx_bytes_per_s: num(data.pcie_rx_bytes_per_s),
    mig_enabled: bool(data.mig_enabled),
    mig_instances: objects(data.mig_instances).map(parseMig),
    processes,
    torch_allocated: num(data.torch_allocated),
    torch_reserved: num(data.torch_reserved),
    compute_mode: str(data.compute_mode)
  };
}

/** One sample, or null when it has no usable timestamp. */
export function parseSample(data: unknown): Sample | null {
  if (!isObject(data)) {
    return null;
  }
  const timestamp = num(data.timestamp);
  if (timestamp === null) {
    return null;
  }
  return {
    timestamp,
    backend: str(data.backend),
    simulated: bool(data.simulated),
    status: str(data.status) ?? 'ok',
    message: str(data.message),
    devices: objects(data.devices).map((d, i) => parseDevice(d, i))
  };
}

export function parseHolder(data: Json): Holder {
  return {
    kind: str(data.kind) ?? 'other',
    label: str(data.label) ?? '',
    summary: str(data.summary) ?? '',
    memory: num(data.memory),
    devices: objects(data.devices)
      .map(d => ({ index: num(d.index), memory: num(d.memory) }))
      .filter((d): d is HolderDevice => d.index !== null),
    pid: num(data.pid),
    kernel_id: str(data.kernel_id),
    kernel_name: str(data.kernel_name),
    paths: list(data.paths).filter((p): p is string => typeof p === 'string' && p !== ''),
    execution_state: str(data.execution_state),
    state: str(data.state),
    idle_seconds: num(data.idle_seconds),
    busy_seconds: num(data.busy_seconds)
  };
}

export function parseAlert(data: Json): Alert {
  return {
    code: str(data.code) ?? '',
    severity: str(data.severity) ?? 'warn',
    device: num(data.device),
    message: str(data.message) ?? ''
  };
}

function checkVersion(data: Json): void {
  const version = num(data.api_version);
  if (version !== null && version > API_VERSION) {
    throw new PayloadError(
      `the server speaks GPU API version ${version}, this panel understands version ${API_VERSION}: ` +
        'reload the page after upgrading jupyter_gpu'
    );
  }
}

/** The reply of `jupyter-gpu/api/metrics`. */
export function parseMetrics(data: unknown): Metrics {
  if (!isObject(data) || !('latest' in data) || !('history' in data)) {
    throw new PayloadError('the GPU metrics reply is not the expected JSON object');
  }
  checkVersion(data);
  return {
    api_version: num(data.api_version),
    server_time: num(data.server_time),
    interval: num(data.interval),
    backend: str(data.backend),
    simulated: bool(data.simulated),
    error: str(data.error),
    latest: parseSample(data.latest),
    history: list(data.history)
      .map(parseSample)
      .filter((s): s is Sample => s !== null),
    holders: objects(data.holders).map(parseHolder),
    alerts: objects(data.alerts).map(parseAlert)
  };
}

function parseCheck(data: unknown): Check | null {
  if (!isObject(data)) {
    return null;
  }
  return {
    status: str(data.status) ?? 'fail',
    verdict: str(data.verdict) ?? '',
    headline: str(data.headline),
    fix: list(data.fix).filter((line): line is string => typeof line === 'string'),
    code: str(data.code)
  };
}

/** The reply of `jupyter-gpu/api/status`. */
export function parseStatus(data: unknown): Status {
  if (!isObject(data) || typeof data.available !== 'boolean') {
    throw new PayloadError('the GPU status reply is not the expected JSON object');
  }
  checkVersion(data);
  return {
    api_version: num(data.api_version),
    interval: num(data.interval),
    sampler_threads: num(data.sampler_threads),
    backend: str(data.backend),
    simulated: bool(data.simulated),
    available: data.available,
    status: str(data.status) ?? 'error',
    reason: str(data.reason),
    devices: objects(data.devices).map((d, i) => ({
      index: num(d.index) ?? i,
      name: str(d.name) ?? '',
      uuid: str(d.uuid) ?? '',
      status: str(d.status) ?? 'ok'
    })),
    check: parseCheck(data.check)
  };
}

// -- history ----------------------------------------------------------------------------------------------

/**
 * `kept` with `incoming` appended: ordered by timestamp, one sample per timestamp (a repeated one
 * replaces the kept one), the newest `cap` kept.
 */
export function mergeHistory(kept: readonly Sample[], incoming: readonly Sample[], cap = HISTORY_CAP): Sample[] {
  let merged: Sample[];
  const last = kept.length ? kept[kept.length - 1].timestamp : -Infinity;
  if (incoming.every((s, i) => s.timestamp > (i === 0 ? last : incoming[i - 1].timestamp))) {
    merged = kept.concat(incoming); // the usual case: newer samples, in order
  } else {
    const byTime = new Map<number, Sample>();
    for (const sample of kept) {
      byTime.set(sample.timestamp, sample);
    }
    for (const sample of incoming) {
      byTime.set(sample.timestamp, sample);
    }
    merged = Array.from(byTime.values()).sort((a, b) => a.timestamp - b.timestamp);
  }
  return merged.length > cap ? merged.slice(merged.length - cap) : merged;
}

/**
 * Several pushed frames as one reply: every reading they carry, in order, with the last frame's `latest`, holders,
 * alerts and header (a frame is a poll's reply: `history` runs up to, not including, its `latest`).
 */
export function joinFrames(frames: readonly Metrics[]): Metrics {
  if (frames.length === 0) {
    throw new PayloadError('no frame to join');
  }
  const last = frames[frames.length - 1];
  const history: Sample[] = [];
  frames.forEach((frame, index) => {
    history.push(...frame.history);
    if (index < frames.length - 1 && frame.latest) {
      history.push(frame.latest);
    }
  });
  return { ...last, history };
}

/** Timestamp to send as `since` next time: the newest sample seen, or undefined for "everything". */
export function sinceOf(history: readonly Sample[], latest: Sample | null): number | undefined {
  const stamps = history.map(s => s.timestamp);
  if (latest) {
    stamps.push(latest.timestamp);
  }
  return stamps.length ? Math.max(...stamps) : undefined;
}

/**
 * The history the charts draw: the kept samples, plus `latest` when the history does not end with it
 * (a reply with nothing new still has a latest sample).
 */
export function chartHistory(history: readonly Sample[], latest: Sample | null): Sample[] {
  if (latest && (!history.length || history[history.length - 1].timestamp < latest.timestamp)) {
    return mergeHistory(history, [latest]);
  }
  return history.slice();
}

// -- charts ---------------------------------------------------------------------------------------------

export type ChartMetric = 'utilization' | 'memory';

export interface Point {
  t: number;
  /** 0 to 100. */
  v: number;
}

function metricValue(device: Device, metric: ChartMetric): number | null {
  if (device.status !== 'ok') {
    return null;
  }
  if (metric === 'utilization') {
    return device.utilization_gpu;
  }
  if (device.memory_used === null || device.memory_total === null || device.memory_total <= 0) {
    return null;
  }
  return (100 * device.memory_used) / device.memory_total;
}

/** One GPU's points in time order: utilisation %, or memory used as % of total; unknown readings skipped. */
export function deviceSeries(history: readonly Sample[], index: number, metric: ChartMetric): Point[] {
  const points: Point[] = [];
  for (const sample of history) {
    const device = sample.devices.find(d => d.index === index);
    const value = device ? metricValue(device, metric) : null;
    if (value !== null) {
      points.push({ t: sample.timestamp, v: Math.min(Math.max(value, 0), 100) });
    }
  }
  return points;
}

export interface TimeWindow {
  start: number;
  end: number;
}

// -- chart windows: the last minute or ten from the kept readings, the last hour from the server's series ----

export type WindowName = '1m' | '10m' | '1h';
export const WINDOWS: ReadonlyArray<{ name: WindowName; seconds: number; label: string }> = [
  { name: '1m', seconds: 60, label: '1 min' },
  { name: '10m', seconds: 600, label: '10 min' },
  { name: '1h', seconds: 3600, label: '1 h' }
];
/** Windows longer than the readings the panel keeps are drawn from the server's downsampled series. */
export const SERIES_FROM_SECONDS = 3600;
/** Buckets asked for a long window: one per 12 s of an hour, a few pixels each in the panel. */
export const SERIES_POINTS = 300;

export function windowSeconds(name: WindowName): number {
  return (WINDOWS.find(w => w.name === name) ?? WINDOWS[1]).seconds;
}

/** The last `seconds` up to the newest reading. */
export function recentWindow(history: readonly Sample[], seconds: number): TimeWindow | null {
  if (!history.length) {
    return null;
  }
  const end = history[history.length - 1].timestamp;
  return { start: end - seconds, end };
}

/** Only the points inside the window: a reading older than it is not drawn left of the chart. */
export function pointsIn(points: readonly Point[], window: TimeWindow): Point[] {
  return points.filter(p => p.t >= window.start && p.t <= window.end);
}

export interface SeriesBand {
  min: Array<number | null>;
  mean: Array<number | null>;
  max: Array<number | null>;
}

export interface Series {
  start: number;
  end: number;
  bucketSeconds: number;
  t: number[];
  devices: Map<number, Partial<Record<ChartMetric, SeriesBand>>>;
}

function band(data: unknown, points: number): SeriesBand | undefined {
  if (!isObject(data)) {
    return undefined;
  }
  const values = (key: string): Array<number | null> => {
    const raw = list(data[key]).map(num);
    return raw.length === points ? raw : new Array(points).fill(null);
  };
  return { min: values('min'), mean: values('mean'), max: values('max') };
}

/** The `/api/series` reply, checked: a bucket list of the wrong length is all gaps, never misplaced points. */
export function parseSeries(data: unknown): Series {
  if (!isObject(data)) {
    throw new PayloadError('the series reply is not an object');
  }
  const t = list(data.t).map(num).filter((v): v is number => v !== null);
  const devices = new Map<number, Partial<Record<ChartMetric, SeriesBand>>>();
  for (const device of objects(data.devices)) {
    const index = num(device.index);
    if (index !== null) {
      devices.set(index, { utilization: band(device.utilization, t.length), memory: band(device.memory, t.length) });
    }
  }
  return { start: num(data.start) ?? 0, end: num(data.end) ?? 0, bucketSeconds: num(data.bucket_seconds) ?? 0, t, devices };
}

export interface ChartData {
  /** The line: each reading, or each bucket's mean. */
  points: Point[];
  /** Each bucket's minimum and maximum (the band around the mean); empty for raw readings. */
  low: Point[];
  high: Point[];
}

/** One GPU's chart from the series: a point per bucket that has a figure, at the bucket's middle. */
export function seriesChart(series: Series, index: number, metric: ChartMetric): ChartData {
  const values = series.devices.get(index)?.[metric];
  const out: ChartData = { points: [], low: [], high: [] };
  if (!values) {
    return out;
  }
  const clamp = (v: number): number => Math.min(Math.max(v, 0), 100);
  series.t.forEach((start, bucket) => {
    const t = start + series.bucketSeconds / 2;
    const mean = values.mean[bucket];
    if (mean !== null) {
      out.points.push({ t, v: clamp(mean) });
      out.low.push({ t, v: clamp(values.min[bucket] ?? mean) });
      out.high.push({ t, v: clamp(values.max[bucket] ?? mean) });
    }
  });
  return out;
}

/** The time the charts span: the whole kept history, at least `MIN_CHART_SPAN_S`. */
export function chartWindow(history: readonly Sample[]): TimeWindow | null {
  if (!history.length) {
    return null;
  }
  const end = history[history.length - 1].timestamp;
  const start = Math.min(history[0].timestamp, end - MIN_CHART_SPAN_S);
  return { start, end };
}

/** "last 2 min": the caption of a chart window. */
export function windowCaption(window: TimeWindow | null): string {
  return window ? formatSpan(window.end - window.start) : '';
}

/** The `points` attribute of a polyline in a `width` × `height` box; 100 % is the top edge. */
export function polylinePoints(points: readonly Point[], window: TimeWindow, width: number, height: number): string {
  const span = window.end - window.start || 1;
  const round = (x: number): string => String(Math.round(x * 10) / 10);
  return points
    .map(p => `${round(((p.t - window.start) / span) * width)},${round(height - (p.v / 100) * height)}`)
    .join(' ');
}

// -- what the panel shows ---------------------------------------------------------------------------------

export type PanelState = 'loading' | 'ok' | 'unavailable' | 'error';

/** What the metrics reply alone says: a GPU to show, nothing yet, or no GPU (ask /status why). */
export function metricsAvailability(metrics: Metrics): 'ok' | 'starting' | 'unavailable' {
  if (metrics.error !== null) {
    return 'unavailable';
  }
  if (metrics.latest === null) {
    return 'starting';
  }
  if (metrics.latest.status !== 'ok' || metrics.latest.devices.length === 0) {
    return 'unavailable';
  }
  return 'ok';
}

/**
 * The panel's `data-state`: `error` while the last request failed, `loading` before the first reading
 * (or while the server says it is starting), `unavailable` with no GPU, `ok` otherwise.
 */
export function panelState(metrics: Metrics | null, status: Status | null, failed: boolean): PanelState {
  if (failed) {
    return 'error';
  }
  if (metrics === null) {
    return 'loading';
  }
  const availability = metricsAvailability(metrics);
  if (availability === 'ok') {
    return 'ok';
  }
  if (availability === 'starting' || (status !== null && status.status === 'starting')) {
    return 'loading';
  }
  return 'unavailable';
}

export interface UnavailableView {
  reason: string;
  verdict: string | null;
  headline: string | null;
  /** The fix lines joined by newlines: what the `<pre>` shows, to copy. */
  fix: string;
  checkStatus: string | null;
}

/** The "no GPU" view: the server's reason, and `%gpucheck`'s verdict and fix from /status. */
export function unavailableView(metrics: Metrics | null, status: Status | null): UnavailableView {
  const reason =
    status?.reason ??
    metrics?.error ??
    metrics?.latest?.message ??
    (status && status.devices.length === 0 ? 'NVML lists no GPU.' : null) ??
    'No GPU is available to this server.';
  const check = status?.check ?? null;
  return {
    reason,
    verdict: check?.verdict || null,
    // As the server gives it: its one brief (GpuCheckReport.brief) already sends null when the verdict says it.
    headline: check?.headline || null,
    fix: check ? check.fix.join('\n') : '',
    checkStatus: check?.status ?? null
  };
}

export interface HolderMemoryLine {
  index: number;
  text: string;
}

export interface HolderRow {
  /** Stable between polls, so a row (and its Open button) is updated in place, not rebuilt. */
  key: string;
  kind: string;
  label: string;
  summary: string;
  /** The server's summary is shown for kernels and processes; "other process" rows show memory only. */
  showSummary: boolean;
  memory: HolderMemoryLine[];
  total: string;
  paths: string[];
  /** "idle 3 h", "busy 2 min", "starting"; null when the holder is not a kernel. */
  state: string | null;
  stateKind: string | null;
  pid: number | null;
  /** For a kernel idle past the warning: how to give its memory back. Null otherwise. */
  hint: string | null;
}

/** What the panel says under a kernel that holds GPU memory idle: the two ways to give it back. */
export const IDLE_HOLDER_HINT =
  'Idle while holding GPU memory: in the notebook, %gpumem shows who holds it and %gpumem --free NAME gives it ' +
  'back; or shut its kernel down (Kernel > Shut Down Kernel).';

/** Whether a holder is a kernel that has run nothing for `idleWarningSeconds` or more. */
export function idleHolder(holder: Holder, idleWarningSeconds: number): boolean {
  return holder.kind === 'kernel' && holder.idle_seconds !== null && holder.idle_seconds >= idleWarningSeconds;
}

function holderState(holder: Holder): { state: string | null; kind: string | null } {
  // The words come from the server ("idle 3 h"); only the colour is chosen here.
  const execution = holder.execution_state;
  if (holder.kind !== 'kernel' || holder.state === null) {
    return { state: null, kind: null };
  }
  return { state: holder.state, kind: execution === 'idle' || execution === 'busy' ? execution : 'other' };
}

/**
 * One table row per holder: kernels idle for `idleWarningSeconds` or more first (the memory to give back), then the
 * rest, each group in the server's order (biggest first).
 */
export function holderRows(holders: readonly Holder[], idleWarningSeconds = Infinity): HolderRow[] {
  const seen = new Map<string, number>();
  const idle = holders.filter(h => idleHolder(h, idleWarningSeconds));
  const ordered = [...idle, ...holders.filter(h => !idleHolder(h, idleWarningSeconds))];
  return ordered.map(holder => {
    let base: string;
    if (holder.kind === 'kernel' && holder.kernel_id) {
      base = `kernel:${holder.kernel_id}`;
    } else if (holder.pid !== null) {
      base = `${holder.kind}:pid:${holder.pid}`;
    } else {
      base = `${holder.kind}:${holder.label}:${holder.devices.map(d => d.index).join(',')}`;
    }
    const count = seen.get(base) ?? 0;
    seen.set(base, count + 1);
    const { state, kind } = holderState(holder);
    return {
      key: count ? `${base}#${count}` : base,
      kind: holder.kind,
      label: holder.label,
      summary: holder.summary,
      showSummary: holder.kind !== 'other',
      memory: holder.devices.map(d => ({ index: d.index, text: `GPU ${d.index}: ${formatBytes(d.memory)}` })),
      total: formatBytes(holder.memory),
      paths: holder.kind === 'kernel' ? holder.paths.slice() : [],
      state,
      stateKind: kind,
      pid: holder.kind === 'process' ? holder.pid : null,
      hint: idleHolder(holder, idleWarningSeconds) ? IDLE_HOLDER_HINT : null
    };
  });
}

/** The indices of the GPUs to draw, in order. */
export function deviceIndices(latest: Sample | null): number[] {
  return latest ? latest.devices.map(d => d.index) : [];
}

/** The poll period in ms: the user's setting, never faster than the server samples. */
export function pollInterval(refreshSeconds: number, serverIntervalSeconds: number | null): number {
  const setting = Number.isFinite(refreshSeconds) && refreshSeconds >= 0.5 ? refreshSeconds : 1;
  const server = serverIntervalSeconds !== null && serverIntervalSeconds > 0 ? serverIntervalSeconds : 0;
  return Math.round(1000 * Math.max(setting, server));
}

// -- the status bar ---------------------------------------------------------------------------------------

/** Above this share of a GPU's memory in use, the status bar turns amber (the server's MEMORY_NEARLY_FULL line). */
export const MEMORY_NEARLY_FULL = 0.9;

/** `ok`: this kernel's GPUs; `none`: no GPU for it; `warn`: amber; `fail`: red; `loading` before the first reply. */
export type StatusLevel = 'ok' | 'none' | 'warn' | 'fail' | 'loading';

export interface StatusView {
  text: string;
  tooltip: string;
  level: StatusLevel;
}

/**
 * The status-bar item for the notebook in focus (`kernelId`, null when none is), from the same reply as the panel:
 * its kernel's GPUs with their utilisation and the memory it holds out of their total; `GPU: none` with the reason
 * when it holds none; amber when it has held memory idle for `idleWarningSeconds` or a GPU it uses is nearly full;
 * red when a GPU is lost or cannot be read, or when every GPU is closed to it (another process holds it in
 * exclusive-process mode, or compute is prohibited).
 */
export function statusView(
  metrics: Metrics | null,
  status: Status | null,
  failed: boolean,
  kernelId: string | null,
  idleWarningSeconds: number
): StatusView {
  if (metrics === null) {
    return failed
      ? { text: 'GPU: ?', tooltip: 'Cannot reach the GPU API of this server; retrying.', level: 'none' }
      : { text: 'GPU …', tooltip: 'Connecting to the GPU monitor…', level: 'loading' };
  }
  const availability = metricsAvailability(metrics);
  if (availability === 'starting') {
    return { text: 'GPU …', tooltip: 'Waiting for the first GPU reading…', level: 'loading' };
  }
  if (availability === 'unavailable') {
    const view = unavailableView(metrics, status);
    const tooltip = [view.reason, view.verdict].filter(Boolean).join('\n');
    return { text: 'GPU: none', tooltip: `${tooltip}\nClick for the GPU panel.`, level: 'none' };
  }
  const latest = metrics.latest as Sample;
  const lost = latest.devices.filter(d => d.status !== 'ok');
  if (lost.length) {
    const names = lost.map(d => `GPU ${d.index}`).join(', ');
    const what = lost.every(d => d.status === 'lost') ? 'lost' : 'unreadable';
    return {
      text: `${names} ${what}`,
      tooltip: lost.map(d => d.error ?? `GPU ${d.index} cannot be read.`).join('\n'),
      level: 'fail'
    };
  }
  const holder =
    kernelId === null ? undefined : metrics.holders.find(h => h.kind === 'kernel' && h.kernel_id === kernelId);
  // GPUs no new process can use: another one holds it in exclusive-process mode, or compute is prohibited.
  const closed = latest.devices.filter(
    d => d.compute_mode === 'prohibited' || (d.compute_mode === 'exclusive_process' && (d.processes ?? []).length > 0)
  );
  const closedText = closed
    .map(d =>
      d.compute_mode === 'prohibited'
        ? `GPU ${d.index} is in prohibited compute mode: no process may use it.`
        : `GPU ${d.index} is held by another process in exclusive-process mode: no other process can create a ` +
          'CUDA context on it ("CUDA-capable device(s) is/are busy or unavailable").'
    )
    .join('\n');
  if (holder === undefined && kernelId !== null && closed.length > 0 && closed.length === latest.devices.length) {
    return {
      text: `GPU ${closed.map(d => d.index).join(',')} taken`,
      tooltip: `${closedText}\nThis notebook cannot use a GPU here until that process ends; ask its owner or the ` +
        "server's administrator.",
      level: 'fail'
    };
  }
  if (holder === undefined) {
    const count = latest.devices.length;
    const reason =
      kernelId === null
        ? 'No notebook is in focus.'
        : "This notebook's kernel holds no GPU memory (it has not put anything on a GPU, or CUDA is not started).";
    const taken = closedText ? `\n${closedText}` : '';
    return {
      text: 'GPU: none',
      tooltip: `${reason}\nThis server has ${count} GPU${count === 1 ? '' : 's'}.${taken}\nClick for the GPU panel.`,
      level: 'none'
    };
  }
  const indices = holder.devices.map(d => d.index);
  const devices = latest.devices.filter(d => indices.includes(d.index));
  const busy = devices.map(d => d.utilization_gpu).filter((v): v is number => v !== null);
  const utilisation = busy.length ? formatPercent(busy.reduce((a, b) => a + b, 0) / busy.length) : 'n/a';
  const totals = devices.map(d => d.memory_total);
  const total = totals.every(t => t !== null) ? totals.reduce((a, b) => (a as number) + (b as number), 0) : null;
  const text = `GPU ${indices.join(',')} · ${utilisation} · ${formatMemory(holder.memory, total)}`;
  const warnings: string[] = [];
  if (idleHolder(holder, idleWarningSeconds)) {
    warnings.push(
      `Idle ${formatDuration(holder.idle_seconds)} while holding ${formatBytes(holder.memory)} of GPU memory: ` +
        '%gpumem shows who holds it and %gpumem --free NAME gives it back; or shut the kernel down.'
    );
  }
  for (const device of devices) {
    const used = device.memory_used;
    const all = device.memory_total;
    if (used !== null && all !== null && all > 0 && used / all > MEMORY_NEARLY_FULL) {
      warnings.push(`GPU ${device.index} memory is nearly full (${formatMemory(used, all)}).`);
    }
  }
  return {
    text,
    tooltip: [holder.summary, ...warnings, 'Click for the GPU panel.'].join('\n'),
    level: warnings.length ? 'warn' : 'ok'
  };
}

// -- settings ---------------------------------------------------------------------------------------------

/** The user's settings (schema/plugin.json). */
export interface PanelSettings {
  refreshInterval: number;
  /** The status bar turns amber when the notebook's kernel has held GPU memory this long without running. */
  idleWarningMinutes: number;
  showUtilization: boolean;
  showMemory: boolean;
  showPowerAndTemperature: boolean;
  showHolders: boolean;
}

export const DEFAULT_SETTINGS: Readonly<PanelSettings> = {
  refreshInterval: 1,
  idleWarningMinutes: 10,
  showUtilization: true,
  showMemory: true,
  showPowerAndTemperature: true,
  showHolders: true
};

/** Settings from the registry's composite, each one checked, the default where missing or wrong. */
export function parseSettings(composite: unknown): PanelSettings {
  const data = isObject(composite) ? composite : {};
  const flag = (name: Exclude<keyof PanelSettings, 'refreshInterval' | 'idleWarningMinutes'>): boolean =>
    typeof data[name] === 'boolean' ? (data[name] as boolean) : DEFAULT_SETTINGS[name];
  const interval = num(data.refreshInterval);
  const idle = num(data.idleWarningMinutes);
  return {
    refreshInterval: interval !== null && interval >= 0.5 ? interval : DEFAULT_SETTINGS.refreshInterval,
    idleWarningMinutes: idle !== null && idle >= 0 ? idle : DEFAULT_SETTINGS.idleWarningMinutes,
    showUtilization: flag('showUtilization'),
    showMemory: flag('showMemory'),
    showPowerAndTemperature: flag('showPowerAndTemperature'),
    showHolders: flag('showHolders')
  };
}
