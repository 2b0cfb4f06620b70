// DOM helpers: every piece of data reaches the page as a text node or an attribute, never as HTML.
import { UI_CONFIG } from './api.js';

/** h('a', {href: '#/', class: 'x', dataset: {id: 1}, on: {click: fn}}, 'text', child) */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === 'on') {
      for (const [event, fn] of Object.entries(value)) node.addEventListener(event, fn);
    } else if (name === 'dataset') {
      for (const [k, v] of Object.entries(value)) node.dataset[k] = String(v);
    } else if (name === 'class') {
      node.className = Array.isArray(value) ? value.filter(Boolean).join(' ') : value;
    } else if (name === 'text') {
      node.textContent = String(value);
    } else if (value === true) {
      node.setAttribute(name, '');
    } else {
      node.setAttribute(name, String(value));
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

export function ago(iso, now = Date.now()) {
  if (!iso) return '—';
  const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

export function ageSeconds(iso, now = Date.now()) {
  return iso ? Math.max(0, (now - Date.parse(iso)) / 1000) : Infinity;
}

export function when(iso) {
  if (!iso) return '';
  return new Date(iso).toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'medium' });
}

export const fmt = (n) => (n === null || n === undefined ? '—' : Number(n).toLocaleString('en-US'));

export function badge(text, kind) {
  return h('span', { class: `badge badge-${kind}` }, text);
}

export const SEVERITIES = UI_CONFIG.severities;

export function severityBadges(counts = {}, silenced = 0) {
  const items = SEVERITIES.filter((s) => counts[s] > 0).map((s) =>
    h('span', { class: `badge badge-${s}`, title: `${counts[s]} firing ${s} alert(s)` }, `${counts[s]} ${s}`));
  // Muted alerts still fire (counted above); say how many of them notify nobody now.
  if (items.length && silenced > 0) {
    items.push(h('span', { class: 'badge badge-muted silenced', dataset: { silenced }, title: 'Notifications muted by a silence' },
      `${silenced} silenced`));
  }
  return items.length ? items : [h('span', { class: 'muted' }, 'none')];
}

/** A run's tainted step ranges (steps it trained while a divergence was open), the first `shown`. */
export function taintSummary(taint, shown = 2) {
  if (!taint || !taint.tainted) return h('span', { class: 'muted', dataset: { tainted: '0' } }, 'none');
  const ranges = taint.ranges || [];
  const more = (taint.ranges_total ?? ranges.length) - Math.min(shown, ranges.length);
  return h('div', { class: 'taint', dataset: { tainted: '1', firstStep: taint.first_step } },
    ranges.slice(0, shown).map((r) => h('div', { class: ['taint-range', r.open ? 'is-open' : ''],
      dataset: { cause: r.cause, firstStep: r.first_step, lastStep: r.last_step }, title: r.worker_ids.length ? `workers: ${r.worker_ids.join(', ')}` : null }, r.summary)),
    more > 0 ? h('div', { class: 'muted small' }, `and ${more} more`) : null);
}

/** Run states in which processes may still log (the heartbeat sweep watches these). */
export const LIVE_RUN_STATES = new Set(UI_CONFIG.live_run_states);

export function stateBadge(state) {
  return h('span', { class: `state state-${state}`, dataset: { state } }, state);
}

/** A clear, actionable error block for an ApiError (backend down, 401, 403, 404...). */
export function errorState(err, retry) {
  const status = err && err.status;
  let title = 'Something went wrong';
  let hint = err && err.message ? err.message : String(err);
  let action = null;
  if (status === 0) {
    title = 'Backend unreachable';
    hint = 'The Paritywatch server did not answer. Check that `paritywatch serve` is running, then retry.';
  } else if (status === 401) {
    title = 'Sign-in required';
    action = h('a', { class: 'button primary', href: '#/signin' }, 'Sign in with a token');
  } else if (status === 403) {
    title = 'Not allowed';
    hint = `${err.message}: your token does not have it.`; // the server's message names the scope: say it once
    action = h('a', { class: 'button', href: '#/signin' }, 'Use another token');
  } else if (status === 404) {
    title = 'Not found';
  }
  const block = h('div', { class: 'error-state', role: 'alert', dataset: { status: status ?? 'unknown' } },
    h('h2', {}, title), h('p', {}, hint));
  const actions = h('div', { class: 'actions' });
  if (retry && status !== 401 && status !== 404) actions.append(h('button', { class: 'button', on: { click: retry } }, 'Retry'));
  if (action) actions.append(action);
  if (actions.childNodes.length) block.append(actions);
  return block;
}

/** A modal dialog (native <dialog>), removed from the page when closed. */
export function modal(title, body, { wide = false, onClose } = {}) {
  const close = h('button', { class: 'icon-button', 'aria-label': 'Close', title: 'Close' }, '×');
  const dialog = h('dialog', { class: wide ? 'modal wide' : 'modal' },
    h('div', { class: 'modal-head' }, h('h2', {}, title), close), h('div', { class: 'modal-body' }, body));
  close.addEventListener('click', () => dialog.close());
  dialog.addEventListener('close', () => { dialog.remove(); if (onClose) onClose(); });
  dialog.addEventListener('click', (e) => { if (e.target === dialog) dialog.close(); });
  document.body.append(dialog);
  dialog.showModal();
  return dialog;
}
