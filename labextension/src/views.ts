/**
 * The panel's parts: a history chart, one GPU's card, one row of the holders table. Each updates its own
 * nodes in place from the model's values.
 */

import { el, setAttr, setChildren, setText, svg } from './dom';
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
import { ChartData, ChartMetric, Device, HolderRow, MigInstance, PanelSettings, polylinePoints, TimeWindow } from './model';

/** The charts' coordinate box; the SVG is stretched to the card's width. */
const CHART_WIDTH = 100;
const CHART_HEIGHT = 30;

// -- one chart ----------------------------------------------------------------------------------------

export class Chart {
  readonly node: HTMLDivElement;
  private readonly _svg: SVGSVGElement;
  private readonly _line: SVGPolylineElement;
  private readonly _area: SVGPolygonElement;
  private readonly _band: SVGPolygonElement;
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
    this._band = svg('polygon', { class: 'jp-GpuPanel-chartBand', points: '' });
    this._line = svg('polyline', { class: 'jp-GpuPanel-chartLine', points: '', 'data-points': '0' });
    this._svg.append(this._area, this._band, this._line);
    this._empty = el('div', 'jp-GpuPanel-chartEmpty', 'not reported');
    this.node.append(this._svg);
  }

  /** The line (each reading, or each bucket's mean) and, for a long window, the band from min to max. */
  update(data: ChartData, window: TimeWindow | null, caption: string): void {
    const points = data.points;
    const line = window ? polylinePoints(points, window, CHART_WIDTH, CHART_HEIGHT) : '';
    const band =
      window && data.high.length > 1
        ? `${polylinePoints(data.high, window, CHART_WIDTH, CHART_HEIGHT)} ${polylinePoints(
            data.low.slice().reverse(),
            window,
            CHART_WIDTH,
            CHART_HEIGHT
          )}`
        : '';
    setAttr(this._band, 'points', band);
    setAttr(this._svg, 'data-band', band ? 'min-max' : null);
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

export class DeviceCard {
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

  update(
    device: Device | undefined,
    chart: (metric: ChartMetric) => ChartData,
    window: TimeWindow | null,
    caption: string
  ): void {
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
      this._util.chart.update(chart('utilization'), window, caption);
    }
    if (this._memory) {
      setText(this._memory.value, ok ? formatMemory(device.memory_used, device.memory_total) : NOT_AVAILABLE);
      const torch =
        ok && device.torch_allocated !== null
          ? `PyTorch allocated ${formatBytes(device.torch_allocated)}, reserved ${formatBytes(device.torch_reserved)}`
          : null;
      setAttr(this._memory.value, 'title', torch);
      this._memory.chart.update(chart('memory'), window, caption);
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

export class HolderRowView {
  readonly node: HTMLTableRowElement;
  private readonly _who: HTMLTableCellElement;
  private readonly _line: HTMLDivElement;
  private readonly _label: HTMLSpanElement;
  private readonly _pid: HTMLSpanElement;
  private readonly _state: HTMLSpanElement;
  private readonly _summary: HTMLDivElement;
  private readonly _hint: HTMLDivElement;
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
    this._hint = el('div', 'jp-GpuPanel-holderHint');
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
    setText(this._hint, row.hint ?? '');
    Private.toggle(this._who, this._hint, row.hint !== null);
    setAttr(this.node, 'data-idle', row.hint !== null ? 'true' : null);

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
