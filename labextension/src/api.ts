/**
 * Requests to the server extension, through Jupyter's own connection settings: the base URL (so it works
 * under JupyterHub's /user/<name>/), the token or XSRF cookie.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export type Endpoint = 'metrics' | 'status' | 'series';

/** The URL of one endpoint, with an optional `since` (Unix seconds). */
export function apiUrl(settings: ServerConnection.ISettings, endpoint: Endpoint, since?: number): string {
  const url = URLExt.join(settings.baseUrl, 'jupyter-gpu', 'api', endpoint);
  return since === undefined ? url : url + URLExt.objectToQueryString({ since: String(since) });
}

export class GpuApi {
  constructor(readonly settings: ServerConnection.ISettings = ServerConnection.makeSettings()) {}

  /** `jupyter-gpu/api/metrics`: the latest sample, the history after `since` (all when omitted), holders, alerts. */
  metrics(since?: number): Promise<unknown> {
    return this._get(apiUrl(this.settings, 'metrics', since));
  }

  /** `jupyter-gpu/api/series`: the last `window` seconds of every GPU in `points` buckets (min, mean, max). */
  series(window: number, points: number): Promise<unknown> {
    const query = URLExt.objectToQueryString({ window: String(window), points: String(points) });
    return this._get(apiUrl(this.settings, 'series') + query);
  }

  /** `jupyter-gpu/api/status`: is there a GPU, and if not why (with `%gpucheck`'s verdict and fix). */
  status(): Promise<unknown> {
    return this._get(apiUrl(this.settings, 'status'));
  }

  private async _get(url: string): Promise<unknown> {
    // A NetworkError (server down, proxy gone) is thrown by makeRequest itself.
    const response = await ServerConnection.makeRequest(url, { method: 'GET' }, this.settings);
    if (!response.ok) {
      throw await ServerConnection.ResponseError.create(response);
    }
    const text = await response.text();
    try {
      return JSON.parse(text);
    } catch {
      throw new Error(`the reply of ${url} is not JSON (HTTP ${response.status})`);
    }
  }
}

/** One short line for the error banner: never a whole HTML page or traceback. */
export function errorText(error: unknown): string {
  let text: string;
  if (error instanceof ServerConnection.ResponseError) {
    const message = error.message || '';
    text = message.startsWith('Invalid response') ? message : `HTTP ${error.response.status}: ${message}`;
  } else if (error instanceof Error) {
    text = error.message || error.name;
  } else {
    text = String(error);
  }
  text = text.replace(/\s+/g, ' ').trim();
  return text.length > 200 ? `${text.slice(0, 199)}…` : text;
}
