/**
 * The server's push stream (`jupyter-gpu/api/metrics/stream`, a WebSocket): each new reading arrives as it is
 * made, in the same JSON as a poll of `jupyter-gpu/api/metrics?since=`, instead of one request per panel per second.
 * The socket is authenticated once, as JupyterLab's kernel sockets are (the login cookie, or the token in the URL
 * where JupyterLab appends it).
 *
 * Frames are kept until the panel takes them (`take()`), so a panel that draws only when its poll ticks (a hidden
 * browser tab) loses nothing; past `MAX_KEPT_FRAMES` the socket is closed instead of growing, and the panel fills
 * the gap with one poll.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';
import { IDisposable } from '@lumino/disposable';

/** About two minutes of readings at the default 1 s: a browser tab hidden longer is caught up by one poll. */
export const MAX_KEPT_FRAMES = 120;

export interface MetricsStreamOptions {
  settings: ServerConnection.ISettings;
  /** Only readings after this Unix time (every kept reading when undefined). */
  since?: number;
  /** At most one frame every `every` seconds (the server never sends faster than it samples). */
  every?: number;
  /** A frame arrived (take it with `take()`). */
  onFrame: () => void;
  /**
   * The socket closed: `delivered` says whether any frame came first (the server sends one as soon as it opens, so
   * a socket that closes without one never reached it: a proxy refused it, or the server is older). Not called
   * after `dispose()`.
   */
  onClose: (delivered: boolean, code: number) => void;
}

/** The stream's URL: the server's WebSocket base, `since` and `every`, and the token where JupyterLab appends one. */
export function streamUrl(settings: ServerConnection.ISettings, since?: number, every?: number): string {
  const query: Record<string, string> = {};
  if (since !== undefined) {
    query.since = String(since);
  }
  if (every !== undefined) {
    query.every = String(every);
  }
  if (settings.appendToken && settings.token) {
    query.token = settings.token;
  }
  const url = URLExt.join(settings.wsUrl, 'jupyter-gpu', 'api', 'metrics', 'stream');
  return Object.keys(query).length ? url + URLExt.objectToQueryString(query) : url;
}

export class MetricsStream implements IDisposable {
  private readonly _socket: WebSocket;
  private readonly _options: MetricsStreamOptions;
  private _frames: unknown[] = [];
  private _opened = false;
  private _delivered = false;
  private _disposed = false;
  private _lastFrameAt = 0;
  /** Date.now() when it was made. */
  readonly createdAt = Date.now();

  constructor(options: MetricsStreamOptions) {
    this._options = options;
    this._socket = new options.settings.WebSocket(streamUrl(options.settings, options.since, options.every));
    this._socket.onopen = () => {
      this._opened = true;
    };
    this._socket.onmessage = event => this._receive(event.data);
    // An error is always followed by a close; the close says what happened.
    this._socket.onclose = event => this._closed(event.code);
  }

  /** Whether the socket is open and the server has answered on it. */
  get isOpen(): boolean {
    return this._opened && this._delivered && !this._disposed && this._socket.readyState === this._socket.OPEN;
  }

  /** Date.now() of the last frame (0 before the first). */
  get lastFrameAt(): number {
    return this._lastFrameAt;
  }

  get isDisposed(): boolean {
    return this._disposed;
  }

  /** The frames that arrived since the last call, oldest first, parsed. */
  take(): unknown[] {
    const frames = this._frames;
    this._frames = [];
    return frames;
  }

  dispose(): void {
    if (this._disposed) {
      return;
    }
    this._disposed = true;
    this._frames = [];
    this._socket.onopen = this._socket.onmessage = this._socket.onclose = null;
    this._socket.close();
  }

  private _receive(data: unknown): void {
    if (this._disposed) {
      return;
    }
    let frame: unknown;
    try {
      frame = JSON.parse(String(data));
    } catch {
      this._socket.close(); // not ours, or cut: the panel polls instead
      return;
    }
    this._lastFrameAt = Date.now();
    this._delivered = true;
    this._frames.push(frame);
    if (this._frames.length > MAX_KEPT_FRAMES) {
      this._socket.close(); // nobody is taking them: one poll will catch up
      return;
    }
    this._options.onFrame();
  }

  private _closed(code: number): void {
    if (this._disposed) {
      return;
    }
    const delivered = this._delivered;
    this.dispose();
    this._options.onClose(delivered, code);
  }
}
