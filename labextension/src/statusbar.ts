/**
 * The status-bar item: the GPUs of the notebook in focus at a glance (`GPU 4 · 41 % · 12.3 GiB / 80.0 GiB`),
 * `GPU: none` with the reason as its tooltip, amber for an idle kernel holding memory or a nearly full GPU, red for a
 * lost GPU. It makes no request of its own: it watches the side panel, so one stream (or poll) feeds both. Clicking
 * opens the panel.
 */

import type { IDisposable } from '@lumino/disposable';
import { Widget } from '@lumino/widgets';

import { el, setAttr, setText } from './dom';
import { statusView } from './model';
import type { GpuPanel } from './panel';

export const STATUS_ITEM_ID = 'jupyter-gpu:status';

export interface GpuStatusOptions {
  panel: GpuPanel;
  /** The kernel id of the notebook (or console) in focus, or null. */
  currentKernel: () => string | null;
  /** Opens the side panel. */
  open: () => void;
}

export class GpuStatusItem extends Widget {
  private readonly _panel: GpuPanel;
  private readonly _currentKernel: () => string | null;
  private readonly _label: HTMLSpanElement;
  private _watch: IDisposable | null = null;

  constructor(options: GpuStatusOptions) {
    super();
    this.addClass('jp-GpuStatus');
    this._panel = options.panel;
    this._currentKernel = options.currentKernel;
    this._label = el('span', 'jp-GpuStatus-text');
    this.node.append(this._label);
    this.node.setAttribute('role', 'button');
    this.node.addEventListener('click', () => options.open());
    this._panel.changed.connect(this.update, this);
    this.update();
  }

  /** Redraw from the panel's last reply (after each frame or poll, and when another notebook comes into focus). */
  update(): void {
    const panel = this._panel;
    const view = statusView(
      panel.metrics,
      panel.status,
      panel.failed,
      this._currentKernel(),
      panel.settings.idleWarningMinutes * 60
    );
    setText(this._label, view.text);
    setAttr(this.node, 'title', view.tooltip);
    setAttr(this.node, 'data-level', view.level);
  }

  protected onAfterAttach(): void {
    this._watch = this._panel.watch();
  }

  protected onBeforeDetach(): void {
    this._watch?.dispose();
    this._watch = null;
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._watch?.dispose();
    this._panel.changed.disconnect(this.update, this);
    super.dispose();
  }
}
