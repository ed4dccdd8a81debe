/**
 * The GPU side panel: a Lumino widget that follows the server extension while it is visible and draws
 * each GPU, who holds its memory, and the server's alerts. Each reading is pushed to it over the server's
 * stream (stream.ts) as it is made; where the stream cannot open (an older server, a proxy without WebSockets)
 * the panel polls instead, and it polls once to fill any gap when the stream closes.
 *
 * Every string that comes from the server (NVML names, process labels, notebook paths, messages) is put
 * in the page as text, through dom.ts (elements, text and attributes; never HTML). The parts it shows
 * (charts, GPU cards, holder rows) are in views.ts.
 */

import { Clipboard } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import type { Message } from '@lumino/messaging';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';
import { IPoll, Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { errorText, GpuApi } from './api';
import { el, setAttr, setChildren, setText } from './dom';
import { gpuIcon } from './icon';
import {
  Alert,
  ChartData,
  ChartMetric,
  chartHistory,
  deviceSeries,
  parseSeries,
  pointsIn,
  recentWindow,
  Series,
  SERIES_FROM_SECONDS,
  SERIES_POINTS,
  seriesChart,
  TimeWindow,
  WindowName,
  WINDOWS,
  windowSeconds,
  HISTORY_CAP,
  holderRows,
  joinFrames,
  mergeHistory,
  Metrics,
  metricsAvailability,
  DEFAULT_SETTINGS,
  PanelSettings,
  panelState,
  parseMetrics,
  parseStatus,
  pollInterval,
  Sample,
  sinceOf,
  Status,
  unavailableView
} from './model';
import { MetricsStream } from './stream';
import { DeviceCard, HolderRowView } from './views';

export const PANEL_ID = 'jupyter-gpu-panel';

export interface GpuPanelOptions {
  /** Opens a notebook (a path relative to the server root) in the main area. */
  openPath: (path: string) => void;
  serverSettings?: ServerConnection.ISettings;
}

const MAX_POLL_MS = 60000;
/** After the stream fails (closed before its first frame, or within STREAM_MIN_LIFE_MS), the panel polls for this
 * long before trying the stream again: a proxy that drops sockets must not cost a reconnection a second. */
const STREAM_RETRY_MS = 60000;
const STREAM_MIN_LIFE_MS = 5000;

export class GpuPanel extends Widget {
  private readonly _api: GpuApi;
  private readonly _openPath: (path: string) => void;
  private readonly _poll: Poll;
  private _settings: PanelSettings = { ...DEFAULT_SETTINGS };

  private readonly _changed = new Signal<this, void>(this);
  /** Others that read this panel's data (the status bar): while any does, the poll runs even when it is hidden. */
  private _watchers = 0;

  private _history: Sample[] = [];
  /** The charts' window; an hour is drawn from the server's downsampled series, fetched at most once a bucket. */
  private _window: WindowName = '10m';
  private _series: Series | null = null;
  private _seriesFetched = 0;
  private readonly _windowButtons = new Map<WindowName, HTMLButtonElement>();
  private _metrics: Metrics | null = null;
  private _status: Status | null = null;
  private _error: string | null = null;
  /** Bumped on show and hide: a reply to an older request is dropped. */
  private _generation = 0;
  private _needFull = true;
  /** The push stream while the panel follows the server; null when it polls (or follows nothing). */
  private _stream: MetricsStream | null = null;
  private _streamFailedAt = -Infinity;

  // Fixed parts of the DOM, attached only when they have something to show.
  private readonly _top: HTMLDivElement;
  private readonly _header: HTMLDivElement;
  private readonly _simulated: HTMLSpanElement;
  private readonly _backend: HTMLSpanElement;
  private readonly _errorLine: HTMLDivElement;
  private readonly _message: HTMLDivElement;
  private readonly _unavailable: HTMLDivElement;
  private _unavailableKey = '';
  private readonly _alerts: HTMLDivElement;
  private _alertsKey = '';
  private readonly _devicesSection: HTMLElement;
  private readonly _devicesCaption: HTMLSpanElement;
  private readonly _devices: HTMLDivElement;
  private _cards = new Map<number, DeviceCard>();
  private readonly _holdersSection: HTMLElement;
  private readonly _holdersTable: HTMLTableElement;
  private readonly _holdersBody: HTMLTableSectionElement;
  private readonly _holdersEmpty: HTMLDivElement;
  private _rows = new Map<string, HolderRowView>();

  constructor(options: GpuPanelOptions) {
    super();
    this.id = PANEL_ID;
    this.addClass('jp-GpuPanel');
    this.node.setAttribute('data-state', 'loading');
    this.node.setAttribute('data-window', '10m');
    this.title.icon = gpuIcon;
    this.title.caption = 'GPU';
    this._api = new GpuApi(options.serverSettings);
    this._openPath = options.openPath;

    // Header and error line stay at the top while the GPUs scroll under them.
    this._top = el('div', 'jp-GpuPanel-top');
    this._header = el('div', 'jp-GpuPanel-header');
    this._header.append(el('span', 'jp-GpuPanel-title', 'GPU'));
    this._simulated = el('span', 'jp-GpuPanel-badge jp-GpuPanel-simulated', 'simulated');
    this._backend = el('span', 'jp-GpuPanel-backend');
    this._errorLine = el('div', 'jp-GpuPanel-error');
    this._errorLine.setAttribute('role', 'alert');
    this._message = el('div', 'jp-GpuPanel-message');
    this._unavailable = el('div', 'jp-GpuPanel-unavailable');
    this._alerts = el('div', 'jp-GpuPanel-alerts');

    this._devicesSection = el('section', 'jp-GpuPanel-section jp-GpuPanel-devicesSection');
    const devicesHead = el('div', 'jp-GpuPanel-sectionHead');
    this._devicesCaption = el('span', 'jp-GpuPanel-caption');
    const windows = el('span', 'jp-GpuPanel-windows');
    windows.setAttribute('role', 'group');
    windows.setAttribute('aria-label', 'Chart window');
    for (const { name, label } of WINDOWS) {
      const button = el('button', 'jp-GpuPanel-window', label);
      button.type = 'button';
      button.setAttribute('data-window', name);
      button.setAttribute('title', `Show the last ${label}`);
      button.addEventListener('click', () => this._chooseWindow(name));
      this._windowButtons.set(name, button);
      windows.append(button);
    }
    devicesHead.append(el('h3', 'jp-GpuPanel-sectionTitle', 'GPUs'), this._devicesCaption, windows);
    this._devices = el('div', 'jp-GpuPanel-devices');
    this._devicesSection.append(devicesHead, this._devices);

    this._holdersSection = el('section', 'jp-GpuPanel-section jp-GpuPanel-holdersSection');
    const holdersHead = el('div', 'jp-GpuPanel-sectionHead');
    holdersHead.append(el('h3', 'jp-GpuPanel-sectionTitle', 'Who holds GPU memory'));
    this._holdersTable = el('table', 'jp-GpuPanel-holders');
    const head = el('thead');
    const headRow = el('tr');
    headRow.append(el('th', undefined, 'Holder'), el('th', undefined, 'Memory'), el('th'));
    head.append(headRow);
    this._holdersBody = el('tbody');
    this._holdersTable.append(head, this._holdersBody);
    this._holdersEmpty = el('div', 'jp-GpuPanel-empty', 'No process holds GPU memory.');
    this._holdersSection.append(holdersHead, this._holdersTable);

    this._poll = new Poll({
      auto: false,
      factory: () => this._tick(),
      frequency: this._frequency(null),
      // Poll only while the browser tab is visible, and this panel is shown or something watches it.
      standby: () => (this.isVisible || this._watchers > 0 ? 'when-hidden' : true),
      name: 'jupyter-gpu:metrics'
    });
    this._render();
  }

  /** Emitted after every poll, answered or failed: what the status bar redraws from. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The last metrics reply (null before the first). */
  get metrics(): Metrics | null {
    return this._metrics;
  }

  /** The last /status reply, asked only when there is no GPU to show. */
  get status(): Status | null {
    return this._status;
  }

  /** Whether the last request failed. */
  get failed(): boolean {
    return this._error !== null;
  }

  /**
   * Keep polling while the returned disposable lives, even with the panel hidden: one request then feeds both the
   * panel and the status bar. While hidden, each poll asks only for what is new (`since`), and draws nothing.
   */
  watch(): IDisposable {
    this._watchers++;
    void this._poll.start();
    if (this._metrics === null) {
      void this._poll.refresh();
    }
    return new DisposableDelegate(() => {
      this._watchers--;
      if (this._watchers === 0 && !this.isVisible) {
        this._stopFollowing();
      }
    });
  }

  /** The settings in force. */
  get settings(): PanelSettings {
    return { ...this._settings };
  }

  /** Apply new settings at once (from the settings editor). */
  set settings(value: PanelSettings) {
    const before = this._settings;
    this._settings = { ...value };
    if (before.refreshInterval !== value.refreshInterval) {
      this._closeStream(); // reopened with the new rate at the next tick
    }
    const layout = (['showUtilization', 'showMemory', 'showPowerAndTemperature'] as const).some(
      k => before[k] !== value[k]
    );
    if (layout) {
      this._cards.clear();
      this._devices.replaceChildren();
    }
    this._poll.frequency = this._frequency(this._metrics?.interval ?? null);
    if (!this.isDisposed) {
      this._render();
    }
  }

  /** Fetch now (the whole history again), whatever the schedule. */
  refresh(): Promise<void> {
    this._generation++;
    this._needFull = true;
    this._closeStream(); // reopened after the full reply, from its newest reading
    return this._poll.refresh();
  }

  /** How the panel follows the server now: `stream` (pushed) or `poll`. */
  get transport(): 'stream' | 'poll' {
    return this._stream?.isOpen ? 'stream' : 'poll';
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._closeStream();
    this._poll.dispose();
    super.dispose();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    // Reopened: the server kept the history, so ask for all of it again.
    void this.refresh();
  }

  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (this.isVisible) {
      void this.refresh();
    }
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._generation++;
    if (this._watchers === 0) {
      this._stopFollowing();
    }
  }

  protected onBeforeDetach(msg: Message): void {
    this._generation++;
    if (this._watchers === 0) {
      this._stopFollowing();
    }
    super.onBeforeDetach(msg);
  }

  private _stopFollowing(): void {
    this._closeStream();
    void this._poll.stop();
  }

  private _closeStream(): void {
    this._stream?.dispose();
    this._stream = null;
  }

  /** Follow the server over its push stream from the newest reading the panel has (unless it failed lately). */
  private _openStream(): void {
    const following = this.isVisible || this._watchers > 0;
    if (this._stream !== null || !following || Date.now() - this._streamFailedAt < STREAM_RETRY_MS) {
      return;
    }
    const stream: MetricsStream = new MetricsStream({
      settings: this._api.settings,
      since: sinceOf(this._history, this._metrics?.latest ?? null),
      every: this._settings.refreshInterval,
      onFrame: () => {
        if (this._stream === stream) {
          void this._poll.refresh(); // draw it now, not at the next tick
        }
      },
      onClose: delivered => {
        if (this._stream !== stream) {
          return;
        }
        this._stream = null;
        if (!delivered || Date.now() - stream.createdAt < STREAM_MIN_LIFE_MS) {
          this._streamFailedAt = Date.now();
        }
        void this._poll.refresh(); // one poll fills the gap; the stream opens again after it, or after the wait
      }
    });
    this._stream = stream;
  }

  /** An open stream that has sent nothing for three of its periods (and 5 s) is treated as gone. */
  private _streamStale(stream: MetricsStream): boolean {
    const period = Math.max(this._settings.refreshInterval, this._metrics?.interval ?? 1);
    return Date.now() - stream.lastFrameAt > 3000 * period + 5000;
  }

  private _frequency(serverInterval: number | null): IPoll.Frequency {
    const interval = pollInterval(this._settings.refreshInterval, serverInterval);
    return { interval, backoff: true, max: Math.max(MAX_POLL_MS, interval) };
  }

  /**
   * One tick: the frames the stream pushed since the last one or, without a stream, one poll of new samples (all of
   * them after a show); plus /status when there is no GPU to show.
   */
  private async _tick(): Promise<void> {
    const stream = this._stream;
    if (!this._needFull && stream !== null && stream.isOpen) {
      if (!this._streamStale(stream)) {
        return this._takeFrames(stream);
      }
      this._closeStream(); // silent for too long: poll, then open it again
    }
    await this._pollOnce();
    this._openStream();
  }

  private async _takeFrames(stream: MetricsStream): Promise<void> {
    const generation = this._generation;
    const frames = stream.take();
    if (frames.length === 0) {
      if (await this._refreshSeries(generation)) {
        this._render(); // a new window's series, asked for by a click
      }
      return;
    }
    let metrics: Metrics;
    let status: Status | null = null;
    try {
      metrics = joinFrames(frames.map(parseMetrics));
      if (metricsAvailability(metrics) !== 'ok') {
        status = parseStatus(await this._api.status());
      }
    } catch (error) {
      this._closeStream(); // what these frames carried comes back with the next poll
      this._failed(error, generation);
      throw error; // the poll backs off
    }
    await this._apply(metrics, status, false, generation);
  }

  private _failed(error: unknown, generation: number): void {
    if (generation === this._generation && !this.isDisposed) {
      this._error = errorText(error);
      this._render();
      this._changed.emit();
    }
  }

  private async _pollOnce(): Promise<void> {
    const generation = this._generation;
    const full = this._needFull;
    const since = full ? undefined : sinceOf(this._history, this._metrics?.latest ?? null);
    let metrics: Metrics;
    let status: Status | null = null;
    try {
      metrics = parseMetrics(await this._api.metrics(since));
      if (metricsAvailability(metrics) !== 'ok') {
        status = parseStatus(await this._api.status());
      }
    } catch (error) {
      this._failed(error, generation);
      throw error; // the poll backs off
    }
    await this._apply(metrics, status, full, generation);
  }

  private async _apply(metrics: Metrics, status: Status | null, full: boolean, generation: number): Promise<void> {
    if (generation !== this._generation || this.isDisposed) {
      return;
    }
    // The server sends each sample once: `history` runs up to, not including, `latest`.
    const incoming = metrics.latest ? [...metrics.history, metrics.latest] : metrics.history;
    this._history = mergeHistory(full ? [] : this._history, incoming, HISTORY_CAP);
    this._needFull = false;
    this._metrics = metrics;
    this._status = status;
    this._error = null;
    this._poll.frequency = this._frequency(metrics.interval);
    await this._refreshSeries(generation);
    this._render();
    this._changed.emit();
  }

  /**
   * For a long window: the server's series again once a bucket has passed (or at once, after a choice). Says
   * whether it fetched one.
   */
  private async _refreshSeries(generation: number): Promise<boolean> {
    const seconds = windowSeconds(this._window);
    if (seconds < SERIES_FROM_SECONDS || !this.isVisible) {
      return false;
    }
    const due = this._series === null ? 0 : this._seriesFetched + this._series.bucketSeconds * 1000;
    if (Date.now() < due) {
      return false;
    }
    const series = parseSeries(await this._api.series(seconds, SERIES_POINTS));
    if (generation === this._generation && windowSeconds(this._window) === seconds) {
      this._series = series;
      this._seriesFetched = Date.now();
      return true;
    }
    return false;
  }

  private _chooseWindow(name: WindowName): void {
    if (name === this._window) {
      return;
    }
    this._window = name;
    this._series = null;
    this.node.setAttribute('data-window', name);
    this._render();
    if (windowSeconds(name) >= SERIES_FROM_SECONDS) {
      void this._poll.refresh(); // fetch the series now, not at the next tick
    }
  }

  // -- rendering -------------------------------------------------------------------------------------

  private _render(): void {
    if (!this.isVisible && this._watchers > 0 && this._metrics !== null) {
      return; // polled for the status bar: drawn when shown (showing asks for the whole history again)
    }
    const metrics = this._metrics;
    const failed = this._error !== null;
    this.node.setAttribute('data-state', panelState(metrics, this._status, failed));
    this.node.setAttribute('data-transport', this.transport);
    const latest = metrics?.latest ?? null;
    if (latest) {
      setAttr(this.node, 'data-last-sample', String(latest.timestamp));
    }

    // Header: title, simulated badge, backend.
    const simulated = metrics?.simulated ?? this._status?.simulated ?? latest?.simulated ?? false;
    const backend = metrics?.backend ?? this._status?.backend ?? null;
    setText(this._backend, backend ?? '');
    setAttr(this._backend, 'title', backend ? `GPU backend: ${backend}` : null);
    setAttr(this._simulated, 'title', simulated ? `Simulated GPUs (${backend ?? 'simulated backend'}): not real readings` : null);
    setChildren(this._header, [
      this._header.firstChild as Node,
      ...(simulated ? [this._simulated] : []),
      ...(backend ? [this._backend] : [])
    ]);

    if (failed) {
      setText(this._errorLine, `Cannot reach the GPU API: ${this._error} — retrying`);
    }
    setChildren(this._top, failed ? [this._header, this._errorLine] : [this._header]);
    const parts: Node[] = [this._top];

    // What to show, whether or not the last request failed (a failure keeps the last data on screen).
    const view = metrics === null ? (failed ? 'none' : 'loading') : panelState(metrics, this._status, false);
    if (view === 'loading') {
      setText(
        this._message,
        metrics === null ? 'Connecting to the GPU monitor…' : 'Waiting for the first GPU reading…'
      );
      parts.push(this._message);
    } else if (view === 'unavailable') {
      this._renderUnavailable();
      parts.push(this._unavailable);
    } else if (view === 'ok' && metrics && latest) {
      this._renderAlerts(metrics.alerts);
      if (metrics.alerts.length) {
        parts.push(this._alerts);
      }
      // Who holds the memory comes before the charts: it is the question this panel answers first.
      if (this._settings.showHolders) {
        this._renderHolders(metrics);
        parts.push(this._holdersSection);
      }
      this._renderDevices(latest);
      parts.push(this._devicesSection);
    }
    setChildren(this.node, parts);
  }

  private _renderUnavailable(): void {
    const view = unavailableView(this._metrics, this._status);
    const key = JSON.stringify(view);
    if (key === this._unavailableKey) {
      return;
    }
    this._unavailableKey = key;
    const nodes: Node[] = [el('div', 'jp-GpuPanel-unavailableTitle', 'No GPU available')];
    nodes.push(el('p', 'jp-GpuPanel-reason', view.reason));
    if (view.verdict) {
      const verdict = el('p', 'jp-GpuPanel-verdict', view.verdict);
      verdict.setAttribute('data-status', view.checkStatus ?? '');
      nodes.push(verdict);
    }
    if (view.headline) {
      nodes.push(el('p', 'jp-GpuPanel-headline', view.headline));
    }
    if (view.fix) {
      const fixHead = el('div', 'jp-GpuPanel-fixHead');
      fixHead.append(el('span', undefined, 'Fix'));
      const copy = el('button', 'jp-GpuPanel-copy jp-mod-styled', 'Copy');
      copy.type = 'button';
      copy.setAttribute('title', 'Copy the fix to the clipboard');
      const fix = view.fix;
      copy.addEventListener('click', () => {
        Clipboard.copyToSystem(fix);
        copy.textContent = 'Copied';
        window.setTimeout(() => (copy.textContent = 'Copy'), 1500);
      });
      fixHead.append(copy);
      nodes.push(fixHead, el('pre', 'jp-GpuPanel-fix', fix));
    }
    nodes.push(el('p', 'jp-GpuPanel-hint', 'Run %gpucheck in a notebook for the full report. This panel keeps checking.'));
    setChildren(this._unavailable, nodes);
  }

  private _renderAlerts(alerts: readonly Alert[]): void {
    const key = JSON.stringify(alerts);
    if (key === this._alertsKey) {
      return;
    }
    this._alertsKey = key;
    setChildren(
      this._alerts,
      alerts.map(alert => {
        const node = el('div', 'jp-GpuPanel-alert');
        node.setAttribute('data-code', alert.code);
        node.setAttribute('data-severity', alert.severity);
        node.setAttribute('role', alert.severity === 'fail' ? 'alert' : 'status');
        node.setAttribute('title', alert.code);
        node.append(
          el('span', 'jp-GpuPanel-alertIcon', alert.severity === 'fail' ? '✖' : '⚠'),
          el('span', 'jp-GpuPanel-alertMessage', alert.message)
        );
        return node;
      })
    );
  }

  private _renderDevices(latest: Sample): void {
    const history = chartHistory(this._history, latest);
    const seconds = windowSeconds(this._window);
    const series = seconds >= SERIES_FROM_SECONDS ? this._series : null;
    const span: TimeWindow | null = series ? { start: series.start, end: series.end } : recentWindow(history, seconds);
    const label = WINDOWS.find(w => w.name === this._window)?.label ?? '';
    const caption = series
      ? `last ${label}, ${Math.round(series.bucketSeconds)} s buckets: mean, min to max`
      : seconds >= SERIES_FROM_SECONDS
        ? `last ${label}: loading…`
        : `last ${label}`;
    setText(this._devicesCaption, caption);
    for (const [name, button] of this._windowButtons) {
      button.setAttribute('aria-pressed', String(name === this._window));
    }
    const chart = (index: number) => (metric: ChartMetric): ChartData =>
      series
        ? seriesChart(series, index, metric)
        : { points: span ? pointsIn(deviceSeries(history, index, metric), span) : [], low: [], high: [] };
    const cards: Node[] = [];
    const seen = new Set<number>();
    for (const device of latest.devices) {
      let card = this._cards.get(device.index);
      if (!card) {
        card = new DeviceCard(device.index, this._settings);
        this._cards.set(device.index, card);
      }
      seen.add(device.index);
      card.update(device, chart(device.index), span, caption);
      cards.push(card.node);
    }
    for (const index of Array.from(this._cards.keys())) {
      if (!seen.has(index)) {
        this._cards.delete(index);
      }
    }
    setChildren(this._devices, cards);
  }

  private _renderHolders(metrics: Metrics): void {
    const rows = holderRows(metrics.holders, this._settings.idleWarningMinutes * 60);
    const nodes: Node[] = [];
    const seen = new Set<string>();
    for (const row of rows) {
      let view = this._rows.get(row.key);
      if (!view) {
        view = new HolderRowView(this._openPath);
        this._rows.set(row.key, view);
      }
      seen.add(row.key);
      view.update(row);
      nodes.push(view.node);
    }
    for (const key of Array.from(this._rows.keys())) {
      if (!seen.has(key)) {
        this._rows.delete(key);
      }
    }
    setChildren(this._holdersBody, nodes);
    const head = this._holdersSection.firstChild as Node;
    setChildren(this._holdersSection, rows.length ? [head, this._holdersTable] : [head, this._holdersEmpty]);
  }
}

