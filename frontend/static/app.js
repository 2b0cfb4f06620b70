// Entry point: a tiny router on location.hash, the identity chip and the sign-in view.
import { ApiError, api, clearToken, forgetIdentity, getToken, setToken, whoami } from './api.js';
import { clear, errorState, h } from './dom.js';

const view = document.getElementById('view');
const identity = document.getElementById('identity');
let cleanup = null;

const routes = [
  [/^#?\/?(runs)?$/, 'runs', async (m, root) => (await import('./runs.js')).renderRuns(root)],
  [/^#\/runs\/(\d+)$/, 'runs', async (m, root) => (await import('./run.js')).renderRun(root, Number(m[1]))],
  [/^#\/compare(?:\?(.*))?$/, 'compare', async (m, root) => (await import('./compare.js')).renderCompare(root, m[1])],
  [/^#\/settings$/, 'settings', async (m, root) => (await import('./settings.js')).renderWebhooks(root)],
  [/^#\/signin$/, 'signin', async (m, root) => renderSignIn(root)],
];

const runCleanup = (fn) => { try { if (fn) fn(); } catch { /* a view's cleanup never blocks navigation */ } };
let navigations = 0; // the latest navigation's number

// Each navigation draws into a page root of its own, swapped into #view at once (charts need
// layout). A page that finishes late (its module or its data arrived after the user moved on, or
// one of its refreshes was in flight) draws into its detached root, never over the current page.
async function route() {
  // A dialog (a diff, a confirmation) belongs to the page it was opened on: Back, a link or a typed
  // address leaves that page, so it closes (dialogs live on <body>, outside the page root).
  for (const dialog of document.querySelectorAll('dialog[open]')) dialog.close();
  runCleanup(cleanup);
  cleanup = null;
  const seq = ++navigations;
  const hash = location.hash || '#/runs';
  const root = h('div', { class: 'page-root' });
  view.replaceChildren(root);
  for (const [pattern, nav, render] of routes) {
    const m = hash.match(pattern);
    if (!m) continue;
    for (const a of document.querySelectorAll('[data-nav]')) a.classList.toggle('active', a.dataset.nav === nav);
    clear(root, h('p', { class: 'muted' }, 'Loading…'));
    let done = null;
    try {
      done = (await render(m, root)) || null;
    } catch (err) {
      if (seq === navigations) clear(root, errorState(err, route));
    }
    if (seq === navigations) cleanup = done;
    else runCleanup(done); // overtaken by a later navigation: stop this page's timers and streams
    return;
  }
  clear(root, errorState(new ApiError(404, 'not_found', `There is no page at ${hash}.`)));
}

export async function renderIdentity() {
  clear(identity);
  let who;
  try {
    who = await whoami(true);
  } catch (err) {
    const label = err.status === 0 ? 'server unreachable' : err.status === 401 ? 'not signed in' : 'token rejected';
    identity.append(h('span', { class: 'who who-bad' }, label), signInButton());
    return;
  }
  const scopes = who.scopes === null ? 'scopes unknown' : who.scopes.join(', ');
  identity.append(h('span', { class: 'who', title: `scopes: ${scopes}` },
    who.open_mode ? 'open mode (no tokens)' : who.name, h('span', { class: 'scopes' }, scopes)));
  identity.append(getToken() ? h('button', { class: 'button small', on: { click: signOut } }, 'Sign out') : signInButton());
}

const signInButton = () => h('a', { class: 'button small', href: '#/signin' }, 'Sign in');

function signOut() {
  clearToken();
  forgetIdentity();
  renderIdentity();
  location.hash = '#/signin';
}

function renderSignIn(root) {
  const input = h('input', { type: 'password', id: 'token', name: 'token', autocomplete: 'off', required: true,
    placeholder: 'pw_…', 'aria-describedby': 'token-help' });
  const message = h('p', { class: 'form-error', role: 'alert' });
  const form = h('form', { class: 'card signin' },
    h('h1', {}, 'Sign in'),
    h('label', { for: 'token' }, 'API token'), input,
    h('p', { id: 'token-help', class: 'muted small' },
      'Kept in this browser tab only (sessionStorage). Create one with `paritywatch token create --scope admin`.'),
    message,
    h('div', { class: 'actions' }, h('button', { class: 'button primary', type: 'submit' }, 'Sign in')));
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    const previous = getToken();
    setToken(input.value);
    forgetIdentity();
    try {
      const who = await whoami(true);
      if (who.unavailable) await api('/runs'); // no /whoami on this server: check the token with a read
      await renderIdentity();
      location.hash = '#/runs';
    } catch (err) {
      if (previous) setToken(previous); else clearToken();
      forgetIdentity();
      message.textContent = err.status === 401 ? 'This token is unknown or revoked.'
        : err.status === 0 ? 'The server cannot be reached.' : err.message;
    }
  });
  clear(root, form);
  input.focus();
}

// On a run page, start fetching and compiling plotly.js (the largest download) before the view asks for it.
if (/^#\/runs\/\d+/.test(location.hash)) import('./charts.js').then((m) => m.loadPlotly()).catch(() => {});
window.addEventListener('hashchange', route);
renderIdentity();
route();
