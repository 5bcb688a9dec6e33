// The console's only door to the gateway: the public REST API with the
// user's bearer token, and the WebSocket event stream opened with a
// single-use ticket (POST /v1/events:ticket), because browsers cannot send
// an Authorization header on a WebSocket.
import { decodeFrame } from './cbor.js';

const TOKEN_KEY = 'pipestream.console.token';

export function getToken() {
  return sessionStorage.getItem(TOKEN_KEY) || '';
}

export function setToken(token) {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  window.dispatchEvent(new CustomEvent('pipestream:token'));
}

export function authHeaders() {
  const t = getToken();
  return t ? { Authorization: 'Bearer ' + t } : {};
}

/** ApiError is a failed API call: HTTP status, gRPC code, reason, message. */
export class ApiError extends Error {
  constructor(status, body, fallback) {
    const msg = (body && (body.message || (body.error && body.error.message))) || fallback || ('HTTP ' + status);
    super(msg);
    this.status = status;
    this.code = body && (body.code ?? (body.error && body.error.code));
    const details = (body && (body.details || (body.error && body.error.details))) || [];
    const info = details.find((d) => d && d.reason);
    this.reason = (info && info.reason) || (body && typeof body.error === 'string' ? body.error : '');
  }
}

export async function errorFrom(resp) {
  let body = null;
  try {
    body = await resp.json();
  } catch {
    // not JSON
  }
  return new ApiError(resp.status, body, resp.statusText);
}

/** api calls a JSON route; it throws ApiError on a non-2xx answer. */
export async function api(path, { method = 'GET', body, signal } = {}) {
  const headers = authHeaders();
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let resp;
  try {
    resp = await fetch(path, { method, headers, signal, body: body === undefined ? undefined : JSON.stringify(body) });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError(0, null, 'the gateway cannot be reached (' + e.message + ')');
  }
  if (!resp.ok) throw await errorFrom(resp);
  return resp.json();
}

/** explain turns an error into words a person can act on. */
export function explain(err) {
  if (!(err instanceof ApiError)) return String(err && err.message ? err.message : err);
  switch (err.status) {
    case 0: return 'The gateway cannot be reached: is it running? ' + err.message;
    case 401: return getToken()
      ? 'The gateway did not accept this bearer token (' + err.message + '). Check the token field at the top.'
      : 'The gateway requires a bearer token: enter yours in the token field at the top.';
    case 403: return 'Not allowed: ' + err.message;
    case 404: return 'Not found. It does not exist, or it belongs to another tenant. (' + err.message + ')';
    case 408: return 'The upload stalled: ' + err.message;
    case 409: return 'Conflict: ' + err.message;
    case 413: return 'Too large: ' + err.message;
    case 429: return 'Slow down: ' + err.message;
    case 503: return 'The gateway is not ready: ' + err.message;
    default: return err.message + (err.reason ? ' (' + err.reason + ')' : '');
  }
}

/** upload POSTs a Blob as the raw body of /v1/documents:upload with XHR so
 * that the upload progress is visible. onProgress(sentBytes, totalBytes). */
export function upload(blob, query, onProgress) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open('POST', '/v1/documents:upload?' + query.toString());
    for (const [k, v] of Object.entries(authHeaders())) xhr.setRequestHeader(k, v);
    xhr.setRequestHeader('Content-Type', blob.type || 'application/octet-stream');
    xhr.responseType = 'json';
    xhr.upload.onprogress = (e) => onProgress(e.loaded, e.lengthComputable ? e.total : blob.size);
    xhr.onload = () => {
      if (xhr.status >= 200 && xhr.status < 300) resolve(xhr.response);
      else reject(new ApiError(xhr.status, xhr.response, xhr.statusText));
    };
    xhr.onerror = () => reject(new ApiError(0, null, 'network error during the upload'));
    xhr.onabort = () => reject(new ApiError(0, null, 'upload aborted'));
    xhr.send(blob);
  });
}

/** fetchResult GETs a document's result as a Response (body not read). */
export async function fetchResult(id) {
  const resp = await fetch('/v1/documents/' + encodeURIComponent(id) + '/result', { headers: authHeaders() });
  if (!resp.ok) throw await errorFrom(resp);
  return resp;
}

/**
 * EventStream follows /v1/events/ws. It asks for a ticket before every
 * (re)connection, resumes after the last seq it saw, and reports its state
 * ('connecting', 'live', 'closed', 'error') to onState(state, detail).
 * onEvent(kind, event) gets every message frame.
 */
export class EventStream {
  constructor({ cursor = null, documentId = '', kinds = [], onEvent, onState = () => {} }) {
    this.cursor = cursor;
    this.documentId = documentId;
    this.kinds = kinds;
    this.onEvent = onEvent;
    this.onState = onState;
    this.lastSeq = 0;
    this.closed = false;
    this.backoff = 500;
    this.ws = null;
    this.timer = 0;
    this.connect();
  }

  async connect() {
    if (this.closed) return;
    this.onState('connecting');
    let ticket;
    try {
      ticket = (await api('/v1/events:ticket', { method: 'POST', body: {} })).ticket;
    } catch (e) {
      if (e instanceof ApiError && (e.status === 401 || e.status === 403)) {
        this.onState('error', explain(e));
        return; // retried when the token changes (a new stream)
      }
      this.retry(explain(e));
      return;
    }
    if (this.closed) return;
    const q = new URLSearchParams({ ticket });
    const cursor = this.lastSeq > 0 ? this.lastSeq + 1 : this.cursor;
    if (cursor !== null && cursor !== undefined) q.set('cursor', String(cursor));
    if (this.documentId) q.set('documentId', this.documentId);
    for (const k of this.kinds) q.append('kinds', k);
    const scheme = location.protocol === 'https:' ? 'wss://' : 'ws://';
    const ws = new WebSocket(scheme + location.host + '/v1/events/ws?' + q.toString());
    ws.binaryType = 'arraybuffer';
    this.ws = ws;
    ws.onopen = () => {
      this.backoff = 500;
      this.onState('live');
    };
    ws.onmessage = (m) => this.frame(m.data);
    ws.onclose = (e) => {
      if (this.ws !== ws) return;
      this.ws = null;
      if (!this.closed) this.retry(e.reason || 'connection closed');
    };
  }

  frame(data) {
    let f;
    try {
      f = decodeFrame(data);
    } catch (e) {
      console.warn('event stream: undecodable frame', e);
      return;
    }
    if (f.header.op === -1) {
      // The server closes after an error frame; the reconnect resumes after
      // the last seq (ConsumerTooSlow) or, for a cursor the log does not
      // know (FutureCursor: a new log), with live events only.
      if (f.payload.error === 'FutureCursor') {
        this.lastSeq = 0;
        this.cursor = null;
      }
      this.onState('connecting', f.payload.error + ': ' + (f.payload.message || ''));
      return;
    }
    const ev = f.payload;
    if (ev.seq && ev.seq > this.lastSeq) this.lastSeq = ev.seq;
    this.onEvent(f.header.t, ev);
  }

  retry(why) {
    if (this.closed) return;
    this.onState('connecting', why);
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.connect(), this.backoff);
    this.backoff = Math.min(this.backoff * 2, 10000);
  }

  close() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.ws) {
      const ws = this.ws;
      this.ws = null;
      ws.close(1000);
    }
    this.onState('closed');
  }
}
