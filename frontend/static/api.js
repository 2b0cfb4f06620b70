// REST client for /api/v1: bearer token from sessionStorage, one error type, the run stream.

/** The server's GET /api/v1/ui-config document (the wire contract's constants the dashboard uses),
 * embedded in the page by the server so no copy of them lives here and the first paint waits for nothing. */
export const UI_CONFIG = JSON.parse(document.querySelector('meta[name="ui-config"]').content);
const BASE = UI_CONFIG.api_prefix;
const TOKEN_KEY = 'paritywatch.token';

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status; // 0 = the server could not be reached
    this.code = code;
  }
}

export const getToken = () => sessionStorage.getItem(TOKEN_KEY) || '';
export const setToken = (token) => sessionStorage.setItem(TOKEN_KEY, token.trim());
export const clearToken = () => sessionStorage.removeItem(TOKEN_KEY);

function headers(extra = {}) {
  const out = { Accept: 'application/json', ...extra };
  const token = getToken();
  if (token) out.Authorization = `Bearer ${token}`;
  return out;
}

export async function api(path, { method = 'GET', body, signal } = {}) {
  const init = { method, signal, headers: headers(body === undefined ? {} : { 'Content-Type': 'application/json' }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  let res;
  try {
    res = await fetch(BASE + path, init);
  } catch (err) {
    if (err.name === 'AbortError') throw err;
    throw new ApiError(0, 'unreachable', 'Cannot reach the Paritywatch server. Is it running?');
  }
  if (res.status === 204) return null;
  let data = null;
  try { data = await res.json(); } catch { /* not JSON: keep null */ }
  if (!res.ok) {
    const e = data && data.error;
    throw new ApiError(res.status, (e && e.code) || `http_${res.status}`, (e && e.message) || res.statusText || 'request failed');
  }
  return data;
}

export const qs = (params) => {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== '') p.set(k, v);
  const s = p.toString();
  return s ? `?${s}` : '';
};

let me = null;
/** The caller's identity. If /whoami is not available, scopes are unknown (null): the server decides. */
export async function whoami(refresh = false) {
  if (me && !refresh) return me;
  try {
    me = await api('/whoami');
  } catch (err) {
    if (err.status !== 404 && err.status !== 405) throw err;
    me = { name: 'unknown', scopes: null, open_mode: false, unavailable: true };
  }
  return me;
}
export const forgetIdentity = () => { me = null; };
export const isAdmin = (who) => !who || who.scopes === null || who.scopes.includes('admin');

const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});

/**
 * Follow GET /runs/{id}/stream with fetch (EventSource cannot send the token), reconnecting with
 * backoff. onEvent(name, data); onStatus('live'|'reconnecting'|'unavailable').
 * Resolves false when the server has no stream endpoint (the caller then polls).
 */
export async function followRun(runId, onEvent, onStatus, signal) {
  let delay = 1000;
  while (!signal.aborted) {
    try {
      const res = await fetch(`${BASE}/runs/${runId}/stream`, { headers: headers({ Accept: 'text/event-stream' }), signal });
      if (res.status === 404 || res.status === 405) { onStatus('unavailable'); return false; }
      if (!res.ok || !res.body) throw new ApiError(res.status, 'stream', `stream answered ${res.status}`);
      onStatus('live');
      delay = 1000;
      await readEvents(res.body, onEvent);
    } catch (err) {
      if (signal.aborted) return true;
    }
    onStatus('reconnecting');
    await sleep(delay, signal);
    delay = Math.min(delay * 2, 15000);
  }
  return true;
}

async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value.replace(/\r\n?/g, '\n');
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      let name = 'message';
      const data = [];
      for (const line of block.split('\n')) {
        if (line.startsWith(':')) continue; // ping comment
        if (line.startsWith('event:')) name = line.slice(6).trim();
        else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
      }
      if (!data.length) continue;
      try { onEvent(name, JSON.parse(data.join('\n'))); } catch { /* a malformed event is skipped */ }
    }
  }
}
