// Run page: header with state and controls, the mismatch banner, parity, alerts, charts, settings; live updates.
import { api, followRun, isAdmin, whoami } from './api.js';
import { renderAlerts } from './alerts.js';
import { createCharts, loadPlotly } from './charts.js';
import { confirmControl, renderControls } from './controls.js';
import { openDiff } from './diff.js';
import { clear, fmt, h, severityBadges } from './dom.js';
import { groupLabel, mismatchGroups, renderParity } from './parity.js';
import { renderRunSettings } from './settings.js';

const POLL_MS = 3000;

export async function renderRun(root, runId) {
  loadPlotly().catch(() => {}); // start fetching plotly.js while the run loads
  const [me, run] = await Promise.all([whoami(), api(`/runs/${runId}`)]);
  const abort = new AbortController();
  const el = {
    live: h('span', { class: 'live', dataset: { live: 'connecting' } }, 'connecting…'),
    step: h('span', { class: 'muted' }),
    firing: h('span', { class: 'firing' }),
    controls: h('div', { class: 'controls' }),
    banner: h('div', { class: 'banner-slot' }),
    parity: h('section', { class: 'card parity', id: 'parity' }),
    alerts: h('section', { class: 'card alerts', id: 'alerts' }),
    charts: h('section', { class: 'card charts', id: 'charts' }),
    settings: h('section', { class: 'card settings', id: 'settings' }),
  };
  clear(root,
    h('nav', { class: 'breadcrumb', 'aria-label': 'Breadcrumb' }, h('a', { href: '#/runs' }, 'Runs'), ' / ', run.project),
    h('div', { class: 'run-head' },
      h('div', { class: 'run-title' }, h('h1', {}, run.name), el.live),
      h('div', { class: 'run-facts' }, el.step, el.firing)),
    el.controls, el.banner,
    h('div', { class: 'run-grid' }, el.parity, el.alerts),
    el.charts, el.settings);

  const state = { run, parity: undefined, alerts: [], versions: {} };
  const charts = createCharts(el.charts, runId, { rules: [], alerts: [] });

  function drawHead() {
    el.step.textContent = `last step ${fmt(state.run.last_step)}`;
    clear(el.firing, 'firing: ', severityBadges(state.run.firing_alerts));
    renderControls(el.controls, state.run, me, (control) => { state.run.control = control; drawHead(); drawBanner(); });
  }

  function drawBanner() {
    const groups = mismatchGroups(state.parity);
    const alerts = (state.alerts || []).filter((a) => a.kind === 'processor_mismatch' && a.status !== 'resolved');
    if (!groups.length && !alerts.length) { clear(el.banner); return; }
    const diff = groups[0]?.diff || alerts[0]?.detail?.diff;
    const names = new Set(groups.flatMap((g) => (g.diff?.components || []).filter((c) => c.severity === 'error').map((c) => c.name)));
    alerts.forEach((a) => (a.detail?.components || []).forEach((n) => names.add(n)));
    const workers = groups.reduce((n, g) => n + g.components.length, 0);
    const paused = state.run.control.state !== 'running';
    const canPause = isAdmin(me) && state.run.control.state === 'running';
    clear(el.banner, h('div', { class: 'banner banner-error', role: 'alert', dataset: { banner: 'mismatch' } },
      h('div', { class: 'banner-text' },
        h('strong', {}, 'Processor mismatch'),
        h('span', {}, groups.length
          ? ` — ${workers} rollout worker(s) do not tokenize like the trainer: `
          : ' — a rollout processor differs from the trainer: ', h('code', {}, [...names].join(', ') || 'see diff'), '. ',
        'The loss is computed on misaligned tokens while this lasts.'),
        paused ? h('span', { class: 'banner-state' }, ` Run is ${state.run.control.state}${state.run.control.actor ? ` by ${state.run.control.actor}` : ''}.`) : null),
      h('div', { class: 'banner-actions' },
        diff ? h('button', { class: 'button', on: { click: () => openDiff(groups[0] ? groupLabel(groups[0]) : 'Processor mismatch', diff, names.has('chat_template') ? 'chat_template' : [...names][0]) } }, 'Show diff') : null,
        canPause ? h('button', { class: 'button warn', dataset: { action: 'pause' }, on: { click: async () => {
          const control = await confirmControl(runId, 'pause', state.run.name);
          if (control) { state.run.control = control; drawHead(); drawBanner(); }
        } } }, 'Pause run') : null)));
  }

  async function optional(path) {
    // The run exists (it just loaded): a 404 here means this server lacks the endpoint.
    try { return await api(path); } catch (err) { if (err.status === 404 || err.status === 405) return null; throw err; }
  }

  async function loadParity() {
    try { state.parity = await optional(`/runs/${runId}/parity`); } catch (err) { state.parity = null; }
    renderParity(el.parity, state.parity);
    drawBanner();
  }

  async function loadAlerts() {
    try {
      const res = await optional(`/runs/${runId}/alerts`);
      state.alerts = res ? res.alerts : null;
    } catch { state.alerts = null; }
    renderAlerts(el.alerts, state.alerts, me, refreshAll);
    charts.setContext({ alerts: state.alerts || [] });
    drawBanner();
  }

  async function refreshRun() {
    state.run = await api(`/runs/${runId}`);
    drawHead();
  }

  function refreshAll() { loadAlerts(); loadParity(); refreshRun().catch(() => {}); }

  function onRunEvent(data) {
    const v = state.versions;
    if (data.control) state.run.control = data.control;
    if (data.firing_alerts) state.run.firing_alerts = data.firing_alerts;
    if (data.last_step !== undefined && data.last_step !== state.run.last_step) {
      state.run.last_step = data.last_step;
      charts.appendLive(data.last_step);
    }
    if (v.alerts !== undefined && v.alerts !== data.alerts_version) loadAlerts();
    if (v.components !== undefined && v.components !== data.components_version) { loadParity(); refreshRun().catch(() => {}); }
    v.alerts = data.alerts_version;
    v.components = data.components_version;
    drawHead();
    drawBanner();
  }

  const setLive = (s, text) => { el.live.dataset.live = s; el.live.textContent = text; };

  function poll() {
    // Fallback when the server has no stream endpoint: the same updates, every few seconds.
    let firing = JSON.stringify(state.run.firing_alerts);
    let comps = JSON.stringify(state.run.components.map((c) => [c.id, c.fingerprint_digest]));
    const timer = setInterval(async () => {
      try {
        const fresh = await api(`/runs/${runId}`, { signal: abort.signal });
        setLive('polling', `polling every ${POLL_MS / 1000} s`);
        const f = JSON.stringify(fresh.firing_alerts);
        const c = JSON.stringify(fresh.components.map((x) => [x.id, x.fingerprint_digest]));
        if (f !== firing) { firing = f; loadAlerts(); }
        if (c !== comps) { comps = c; loadParity(); }
        if (fresh.last_step !== state.run.last_step) charts.appendLive(fresh.last_step);
        state.run = fresh;
        drawHead();
        drawBanner();
      } catch (err) {
        if (!abort.signal.aborted) setLive('reconnecting', err.status === 0 ? 'backend unreachable — retrying' : `update failed: ${err.message}`);
      }
    }, POLL_MS);
    abort.signal.addEventListener('abort', () => clearInterval(timer));
  }

  drawHead();
  loadParity();
  loadAlerts();
  renderRunSettings(el.settings, runId, me, (rules) => charts.setContext({ rules }));
  followRun(runId, (name, data) => { if (name === 'run') onRunEvent(data); },
    (s) => setLive(s, { live: '● live', reconnecting: 'reconnecting…', unavailable: 'polling' }[s] || s), abort.signal)
    .then((streamed) => { if (!streamed && !abort.signal.aborted) poll(); });

  return () => { abort.abort(); charts.destroy(); };
}
