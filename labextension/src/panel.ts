/**
 * The GPU side panel: a Lumino widget that polls the server extension while it is visible and draws
 * each GPU, who holds its memory, and the server's alerts.
 *
 * Every string that comes from the server (NVML names, process labels, notebook paths, messages) is put
 * in the page as text: the DOM is built with createElement/createElementNS, textContent and setAttribute
 * only, never from HTML.
 */

import { Clipboard } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import type { Message } from '@lumino/messaging';
import { IPoll, Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { errorText, GpuApi } from './api';
import {
  formatBytes,
  formatClock,
  formatMemory,
  formatPercent,
  formatPower,
  formatRate,
  formatTemperature,
  NOT_AVAILABLE
} from './format';
import { gpuIcon } from './icon';
import {
  Alert,
  chartHistory,
  ChartMetric,
  chartWindow,
  Device,
  deviceSeries,
  HISTORY_CAP,
  HolderRow,
  holderRows,
  mergeHistory,
  Metrics,
  metricsAvailability,
  MigInstance,
  DEFAULT_SETTINGS,
  PanelSettings,
  panelState,
  parseMetrics,
  parseStatus,
  pollInterval,
  polylinePoints,
  Sample,
  sinceOf,
  Status,
  TimeWindow,
  unavailableView,
  windowCaption
} from './model';

export const PANEL_ID = 'jupyter-gpu-panel';

export interface GpuPanelOptions {
  /** Opens a notebook (a path relative to the server root) in the main area. */
  openPath: (path: string) => void;
  serverSettings?: ServerConnection.ISettings;
}

const SVG_NS = 'http://www.w3.org/2000/svg';
/** The charts' coordinate box; the SVG is stretched to the card's width. */
const CHART_WIDTH = 100;
const CHART_HEIGHT = 30;
const MAX_POLL_MS = 60000;

// -- DOM helpers (text only) ------------------------------------------------------------------------------

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className?: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

function svg<K extends keyof SVGElementTagNameMap>(tag: K, attributes: Record<string, string> = {}): SVGElementTagNameMap[K] {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes)) {
    node.setAttribute(name, value);
  }
  return node;
}

function setText(node: Element, text: string): void {
  if (node.textContent !== text) {
    node.textContent = text;
  }
}

function setAttr(node: Element, name: string, value: string | null): void {
  if (value === null) {
    node.removeAttribute(name);
  } else if (node.getAttribute(name) !== value) {
    node.setAttribute(name, value);
  }
}

/** Make `parent`'s children exactly `children`, in order, moving only what is out of place. */
function setChildren(parent: Element, children: readonly Node[]): void {
  children.forEach((child, i) => {
    if (parent.childNodes[i] !== child) {
      parent.insertBefore(child, parent.childNodes[i] ?? null);
    }
  });
  while (parent.childNodes.length > children.length) {
    parent.removeChild(parent.lastChild as ChildNode);
  }
}

// -- one chart ----------------------------------------------------------------------------------------

class Chart {
  readonly node: HTMLDivElement;
  private readonly _svg: SVGSVGElement;
  private readonly _line: SVGPolylineElement;
  private readonly _area: SVGPolygonElement;
  private readonly _empty: HTMLDivElement;

  constructor(readonly metric: ChartMetric, label: string) {
    this.node = el('div', 'jp-GpuPanel-chartBox');
    this._svg = svg('svg', {
      class: 'jp-GpuPanel-chart',
      'data-metric': metric,
      viewBox: `0 0 ${CHART_WIDTH} ${CHART_HEIGHT}`,
      preserveAspectRatio: 'none',
      role: 'img',
      'aria-label': label,
      'data-points': '0'
    });
    for (const y of [CHART_HEIGHT / 2]) {
      this._svg.appendChild(
        svg('line', { class: 'jp-GpuPanel-chartGrid', x1: '0', x2: String(CHART_WIDTH), y1: String(y), y2: String(y) })
      );
    }
    this._area = svg('polygon', { class: 'jp-GpuPanel-chartArea', points: '' });
    this._line = svg('polyline', { class: 'jp-GpuPanel-chartLine', points: '', 'data-points': '0' });
    this._svg.append(this._area, this._line);
    this._empty = el('div', 'jp-GpuPanel-chartEmpty', 'not reported');
    this.node.append(this._svg);
  }

  update(history: readonly Sample[], index: number, window: TimeWindow | null, caption: string): void {
    const points = deviceSeries(history, index, this.metric);
    const line = window ? polylinePoints(points, window, CHART_WIDTH, CHART_HEIGHT) : '';
    setAttr(this._line, 'points', line);
    // The count is on the polyline and on its chart (the browser tests read the chart's).
    setAttr(this._line, 'data-points', String(points.length));
    setAttr(this._svg, 'data-points', String(points.length));
    let area = '';
    if (window && points.length > 1) {
      const first = line.slice(0, line.indexOf(',')); // x of the first point
      const last = line.slice(line.lastIndexOf(' ') + 1).split(',')[0];
      area = `${first},${CHART_HEIGHT} ${line} ${last},${CHART_HEIGHT}`;
    }
    setAttr(this._area, 'points', area);
    setAttr(this.node, 'title', caption);
    if (points.length === 0 && this._empty.parentNode !== this.node) {
      this.node.appendChild(this._empty);
    } else if (points.length > 0 && this._empty.parentNode === this.node) {
      this.node.removeChild(this._empty);
    }
  }
}

// -- one GPU card -----------------------------------------------------------------------------------------

class DeviceCard {
  readonly node: HTMLDivElement;
  private readonly _name: HTMLSpanElement;
  private readonly _throttled: HTMLSpanElement;
  private readonly _problem: HTMLDivElement;
  private readonly _util?: { value: HTMLSpanElement; chart: Chart };
  private readonly _memory?: { value: HTMLSpanElement; chart: Chart };
  private readonly _stats?: { power: HTMLSpanElement; temperature: HTMLSpanElement; clock: HTMLSpanElement };
  private readonly _mig: HTMLDivElement;
  private _migKey = '';

  constructor(readonly index: number, settings: PanelSettings) {
    this.node = el('div', 'jp-GpuPanel-device');
    this.node.setAttribute('data-gpu-index', String(index));

    const head = el('div', 'jp-GpuPanel-deviceHeader');
    head.append(el('span', 'jp-GpuPanel-deviceIndex', `GPU ${index}`));
    this._name = el('span', 'jp-GpuPanel-deviceName');
    this._throttled = el('span', 'jp-GpuPanel-badge jp-GpuPanel-throttled', 'throttled');
    head.append(this._name);
    this._problem = el('div', 'jp-GpuPanel-deviceProblem');
    this.node.append(head);

    const metrics = el('div', 'jp-GpuPanel-metrics');
    if (settings.showUtilization) {
      const value = el('span', 'jp-GpuPanel-value jp-GpuPanel-utilization', NOT_AVAILABLE);
      const chart = new Chart('utilization', `GPU ${index} utilisation history`);
      metrics.append(Private.metricBox('Utilisation', value, chart));
      this._util = { value, chart };
    }
    if (settings.showMemory) {
      const value = el('span', 'jp-GpuPanel-value jp-GpuPanel-memory', NOT_AVAILABLE);
      const chart = new Chart('memory', `GPU ${index} memory history`);
      metrics.append(Private.metricBox('Memory', value, chart));
      this._memory = { value, chart };
    }
    if (metrics.childNodes.length) {
      this.node.append(metrics);
    }
    if (settings.showPowerAndTemperature) {
      const stats = el('div', 'jp-GpuPanel-stats');
      const power = el('span', 'jp-GpuPanel-power', NOT_AVAILABLE);
      const temperature = el('span', 'jp-GpuPanel-temperature', NOT_AVAILABLE);
      const clock = el('span', 'jp-GpuPanel-clock', NOT_AVAILABLE);
      stats.append(
        Private.stat('Power', power),
        Private.stat('Temp', temperature),
        Private.stat('SM', clock)
      );
      this.node.append(stats);
      this._stats = { power, temperature, clock };
    }
    this._mig = el('div', 'jp-GpuPanel-mig');
  }

  update(device: Device | undefined, history: readonly Sample[], window: TimeWindow | null, caption: string): void {
    const status = device ? device.status : 'lost';
    setAttr(this.node, 'data-status', status);
    setText(this._name, device ? device.name : '');
    setAttr(this._name, 'title', device ? `${device.name}\n${device.uuid}` : null);

    // Throttled marker, with the reasons NVML gave.
    const throttled = device?.throttled === true;
    if (throttled) {
      setAttr(this._throttled, 'title', `Clocks reduced: ${(device?.throttle_reasons ?? []).join(', ') || 'reason not reported'}`);
      if (!this._throttled.parentNode) {
        this._name.after(this._throttled);
      }
    } else if (this._throttled.parentNode) {
      this._throttled.remove();
    }

    // A lost or failing GPU says so, with NVML's error.
    if (status !== 'ok') {
      const what = status === 'lost' ? 'GPU lost' : 'GPU error';
      setText(this._problem, device?.error ? `${what}: ${device.error}` : `${what}: no reading`);
      if (!this._problem.parentNode) {
        this.node.children[0].after(this._problem);
      }
    } else if (this._problem.parentNode) {
      this._problem.remove();
    }

    const ok = device !== undefined && status === 'ok';
    if (this._util) {
      setText(this._util.value, formatPercent(ok ? device.utilization_gpu : null));
      setAttr(
        this._util.value,
        'title',
        ok && device.utilization_gpu === null
          ? device.mig_enabled
            ? 'NVML does not report utilisation for a GPU in MIG mode'
            : 'This GPU does not report its utilisation'
          : null
      );
      this._util.chart.update(history, this.index, window, caption);
    }
    if (this._memory) {
      setText(this._memory.value, ok ? formatMemory(device.memory_used, device.memory_total) : NOT_AVAILABLE);
      const torch =
        ok && device.torch_allocated !== null
          ? `PyTorch allocated ${formatBytes(device.torch_allocated)}, reserved ${formatBytes(device.torch_reserved)}`
          : null;
      setAttr(this._memory.value, 'title', torch);
      this._memory.chart.update(history, this.index, window, caption);
    }
    if (this._stats) {
      setText(this._stats.power, ok ? formatPower(device.power_w, device.power_limit_w) : NOT_AVAILABLE);
      setText(this._stats.temperature, formatTemperature(ok ? device.temperature_c : null));
      setText(this._stats.clock, formatClock(ok ? device.sm_clock_mhz : null));
      const pcie =
        ok && (device.pcie_rx_bytes_per_s !== null || device.pcie_tx_bytes_per_s !== null)
          ? `PCIe: ${formatRate(device.pcie_rx_bytes_per_s)} in, ${formatRate(device.pcie_tx_bytes_per_s)} out`
          : null;
      setAttr(this._stats.clock, 'title', pcie);
    }
    this._updateMig(ok ? device.mig_instances : []);
  }

  private _updateMig(slices: readonly MigInstance[]): void {
    const key = JSON.stringify(slices);
    if (key === this._migKey) {
      return;
    }
    this._migKey = key;
    if (!slices.length) {
      this._mig.remove();
      return;
    }
    const rows: Node[] = [el('div', 'jp-GpuPanel-migTitle', `MIG: ${slices.length} slice${slices.length > 1 ? 's' : ''}`)];
    for (const slice of slices) {
      const row = el('div', 'jp-GpuPanel-migSlice');
      row.setAttribute('data-gi', slice.gpu_instance_id === null ? '' : String(slice.gpu_instance_id));
      row.setAttribute('title', `${slice.uuid}${slice.gpu_instance_id !== null ? ` (GPU instance ${slice.gpu_instance_id})` : ''}`);
      const bar = el('span', 'jp-GpuPanel-bar');
      const fill = el('span', 'jp-GpuPanel-barFill');
      if (slice.memory_used !== null && slice.memory_total) {
        fill.style.width = `${Math.min(100, (100 * slice.memory_used) / slice.memory_total).toFixed(1)}%`;
      }
      bar.append(fill);
      row.append(
        el('span', 'jp-GpuPanel-migProfile', slice.profile || NOT_AVAILABLE),
        bar,
        el('span', 'jp-GpuPanel-migMemory', formatMemory(slice.memory_used, slice.memory_total))
      );
      rows.push(row);
    }
    setChildren(this._mig, rows);
    if (!this._mig.parentNode) {
      this.node.append(this._mig);
    }
  }
}

// -- one holder row ---------------------------------------------------------------------------------------

class HolderRowView {
  readonly node: HTMLTableRowElement;
  private readonly _who: HTMLTableCellElement;
  private readonly _line: HTMLDivElement;
  private readonly _label: HTMLSpanElement;
  private readonly _pid: HTMLSpanElement;
  private readonly _state: HTMLSpanElement;
  private readonly _summary: HTMLDivElement;
  private readonly _memory: HTMLTableCellElement;
  private readonly _actions: HTMLTableCellElement;
  private _memoryKey = '';
  private _pathsKey: string | null = null;

  constructor(private readonly _open: (path: string) => void) {
    this.node = el('tr', 'jp-GpuPanel-holder');
    this._who = el('td', 'jp-GpuPanel-holderWho');
    this._line = el('div', 'jp-GpuPanel-holderLine');
    this._label = el('span', 'jp-GpuPanel-holderLabel');
    this._pid = el('span', 'jp-GpuPanel-holderPid');
    this._state = el('span', 'jp-GpuPanel-holderState');
    this._line.append(this._label);
    this._who.append(this._line);
    this._summary = el('div', 'jp-GpuPanel-holderSummary');
    this._memory = el('td', 'jp-GpuPanel-holderMemory');
    this._actions = el('td', 'jp-GpuPanel-holderActions');
    this.node.append(this._who, this._memory, this._actions);
  }

  update(row: HolderRow): void {
    setAttr(this.node, 'data-kind', row.kind);
    setText(this._label, row.label);
    setAttr(this._label, 'title', row.paths.length ? row.paths.join('\n') : row.label);
    // The server user's own processes show their pid; kernels their state.
    setText(this._pid, row.pid !== null ? `pid ${row.pid}` : '');
    setText(this._state, row.state ?? '');
    setAttr(this._state, 'data-state', row.stateKind);
    setChildren(this._line, [
      this._label,
      ...(row.pid !== null ? [this._pid] : []),
      ...(row.state !== null ? [this._state] : [])
    ]);
    // "other process": memory only, the summary as a tooltip.
    Private.toggle(this._who, this._summary, row.showSummary);
    setText(this._summary, row.summary);
    setAttr(this.node, 'title', row.showSummary ? null : row.summary);

    const memoryKey = JSON.stringify(row.memory);
    if (memoryKey !== this._memoryKey) {
      this._memoryKey = memoryKey;
      setChildren(
        this._memory,
        row.memory.map(m => {
          const line = el('div', 'jp-GpuPanel-holderGpu', m.text);
          line.setAttribute('data-gpu-index', String(m.index));
          return line;
        })
      );
    }

    const pathsKey = JSON.stringify(row.paths);
    if (pathsKey !== this._pathsKey) {
      this._pathsKey = pathsKey;
      setChildren(
        this._actions,
        row.paths.map(path => {
          const button = el('button', 'jp-GpuPanel-open jp-mod-styled', 'Open');
          button.type = 'button';
          button.setAttribute('data-path', path);
          button.setAttribute('title', `Open ${path}`);
          button.setAttribute('aria-label', `Open ${path}`);
          button.addEventListener('click', () => {
            const target = button.getAttribute('data-path');
            if (target) {
              this._open(target);
            }
          });
          return button;
        })
      );
    }
  }
}

// -- the panel ----------------------------------------------------------------------------------------------

export class GpuPanel extends Widget {
  private readonly _api: GpuApi;
  private readonly _openPath: (path: string) => void;
  private readonly _poll: Poll;
  private _settings: PanelSettings = { ...DEFAULT_SETTINGS };

  private _history: Sample[] = [];
  private _metrics: Metrics | null = null;
  private _status: Status | null = null;
  private _error: string | null = null;
  /** Bumped on show and hide: a reply to an older request is dropped. */
  private _generation = 0;
  private _needFull = true;

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
    devicesHead.append(el('h3', 'jp-GpuPanel-sectionTitle', 'GPUs'), this._devicesCaption);
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
      // Poll only while this panel is shown and the browser tab is visible.
      standby: () => (this.isVisible ? 'when-hidden' : true),
      name: 'jupyter-gpu:metrics'
    });
    this._render();
  }

  /** The settings in force. */
  get settings(): PanelSettings {
    return { ...this._settings };
  }

  /** Apply new settings at once (from the settings editor). */
  set settings(value: PanelSettings) {
    const before = this._settings;
    this._settings = { ...value };
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
    return this._poll.refresh();
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
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
    void this._poll.stop();
  }

  protected onBeforeDetach(msg: Message): void {
    this._generation++;
    void this._poll.stop();
    super.onBeforeDetach(msg);
  }

  private _frequency(serverInterval: number | null): IPoll.Frequency {
    const interval = pollInterval(this._settings.refreshInterval, serverInterval);
    return { interval, backoff: true, max: Math.max(MAX_POLL_MS, interval) };
  }

  /** One poll: new samples (all of them after a show), plus /status when there is no GPU to show. */
  private async _tick(): Promise<void> {
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
      if (generation === this._generation && !this.isDisposed) {
        this._error = errorText(error);
        this._render();
      }
      throw error; // the poll backs off
    }
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
    this._render();
  }

  // -- rendering -------------------------------------------------------------------------------------

  private _render(): void {
    const metrics = this._metrics;
    const failed = this._error !== null;
    this.node.setAttribute('data-state', panelState(metrics, this._status, failed));
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
    const span = chartWindow(history);
    const caption = windowCaption(span);
    setText(this._devicesCaption, caption);
    const cards: Node[] = [];
    const seen = new Set<number>();
    for (const device of latest.devices) {
      let card = this._cards.get(device.index);
      if (!card) {
        card = new DeviceCard(device.index, this._settings);
        this._cards.set(device.index, card);
      }
      seen.add(device.index);
      card.update(device, history, span, caption);
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
    const rows = holderRows(metrics.holders);
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

namespace Private {
  export function metricBox(label: string, value: HTMLElement, chart: Chart): HTMLElement {
    const box = el('div', 'jp-GpuPanel-metric');
    const head = el('div', 'jp-GpuPanel-metricHead');
    head.append(el('span', 'jp-GpuPanel-label', label), value);
    box.append(head, chart.node);
    return box;
  }

  export function stat(label: string, value: HTMLElement): HTMLElement {
    const node = el('span', 'jp-GpuPanel-stat');
    node.append(el('span', 'jp-GpuPanel-label', label), value);
    return node;
  }

  /** Attach `child` at the end of `parent` when `show`, detach it otherwise. */
  export function toggle(parent: HTMLElement, child: HTMLElement, show: boolean): void {
    if (show && child.parentNode !== parent) {
      parent.appendChild(child);
    } else if (!show && child.parentNode === parent) {
      parent.removeChild(child);
    }
  }
}
