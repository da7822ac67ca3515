/**
 * Requests to the Kiwi server extension and to the server's own permission check. Every call goes
 * through ServerConnection, so the server's authentication (token, cookie, XSRF) applies.
 */

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import type { INvmlReading } from './nvml';
import { ISchedulerChange, IStatusDocument } from './tokens';

/** A request the server answered with an error status; `status` says which. */
export class KiwiRequestError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
    this.name = 'KiwiRequestError';
  }
}

async function request<T>(path: string, init: RequestInit = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, path);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const text = await response.text();
  let body: any = null;
  if (text.length > 0) {
    try {
      body = JSON.parse(text);
    } catch {
      body = null;
    }
  }
  if (!response.ok) {
    const reason = body?.message ?? body?.reason ?? response.statusText;
    throw new KiwiRequestError(response.status, reason);
  }
  return body as T;
}

export function fetchStatus(): Promise<IStatusDocument> {
  return request<IStatusDocument>('kiwi/api/status');
}

/**
 * The long-poll: answers when the status document's tag is no longer `after` (at once for a tag
 * the server does not have, e.g. ''), or with a fresh document after the server's timeout.
 */
export function waitForStatus(after: string, signal?: AbortSignal): Promise<IStatusDocument> {
  return request<IStatusDocument>(`kiwi/api/status?after=${encodeURIComponent(after)}`, { signal });
}

export function changeScheduler(change: ISchedulerChange): Promise<IStatusDocument> {
  return request<IStatusDocument>('kiwi/api/scheduler', {
    method: 'POST',
    body: JSON.stringify(change)
  });
}

/** Tell the server a kernel's notebook came to the front (front.ts): `hinted` false when it
 * hinted within the last second or the daemon is away. */
export function hintFront(kernelId: string): Promise<{ hinted: boolean }> {
  return request<{ hinted: boolean }>('kiwi/api/intent', {
    method: 'POST',
    body: JSON.stringify({ kernel: kernelId })
  });
}

/**
 * Whether the server's authorizer lets this user write resource "kiwi". The server answers this
 * itself (`/api/me`), so the panel shows controls exactly to those whose POST would succeed.
 */
export async function canWriteKiwi(): Promise<boolean> {
  const query = encodeURIComponent(JSON.stringify({ kiwi: ['write'] }));
  const me = await request<{ permissions?: Record<string, string[]> }>(
    `api/me?permissions=${query}`
  );
  return me.permissions?.kiwi?.includes('write') ?? false;
}

/** What NVML reads on the server's machine (nvml.ts). */
export function fetchNvml(): Promise<INvmlReading> {
  return request<INvmlReading>('kiwi/api/nvml');
}
