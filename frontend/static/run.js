// Run page: header with state and controls, the mismatch banner, what the run trained on (tainted
// steps, kept after the alerts resolve), parity, alerts, sample audit, charts, settings; live updates.
import { api, followRun, isAdmin, qs, whoami } from './api.js';
import { renderAlerts } from './alerts.js';
import { renderAudit } from './audit.js';
import { createCharts, loadPlotly } from './charts.js';
import { actionAllowed, confirmControl, renderControls } from './controls.js';
import { findingNames, findings, openDiff } from './diff.js';
import { LIVE_RUN_STATES, ago, clear, fmt, h, modal, severityBadges, taintSummary, when } from './dom.js';
import { groupLabel, mismatchGroups, renderParity } from './parity.js';
import { ENDED_HELP, processCounts, processText } from './runs.js';
import { renderRunSettings } from './settings.js';
import { renderSilences } from './silences.js';
import { createWorkersView, prefetchWorkers } from './workers.js';

const POLL_MS = 3000;
const AUDIT_REFRESH_MS = 5000; // the audit reloads at most this often while steps advance

export async function renderRun(root, runId) {
  loadPlotly().catch(() => {}); // start fetching plotly.js while the run loads
  const workersFirst = prefetchWorkers(runId); // the workers table is drawn as soon as the page is built
  const [me, run] = await Promise.all([whoami(), api(`/runs/${runId}`)]);
  const abort = new AbortController();
  const el = {
    live: h('span', { class: 'live', dataset: { live: 'connecting' } }, 'connecting…'),
    step: h('span', { class: 'muted' }),
    firing: h('span', { class: 'firing' }),
    processes: h('span', { class: 'processes' }),
    // The workers view sits below the charts (they stay the first screen): one click away.
    toWorkers: h('button', { class: 'link-button small', dataset: { action: 'show-workers' },
      on: { click: () => el.workers.scrollIntoView({ block: 'start' }) } }, 'workers view ↓'),
    ended: h('span', { class: 'ended' }),
    controls: h('div', { class: 'controls' }),
    silences: h('div', { class: 'silences', id: 'silences' }),
    banner: h('div', { class: 'banner-slot' }),
    taint: h('div', { class: 'taint-slot', id: 'taint' }),
    packs: h('div', { class: 'pack-slot' }),
    parity: h('section', { class: 'card parity', id: 'parity' }),
    alerts: h('section', { class: 'card alerts', id: 'alerts' }),
    audit: h('section', { class: 'card audit', id: 'audit' }),
    workers: h('section', { class: 'card workers-view', id: 'workers' }),
    charts: h('section', { class: 'card charts', id: 'charts' }),
    settings: h('section', { class: 'card settings', id: 'settings' }),
    danger: h('section', { class: 'card danger-zone', id: 'delete' }),
  };
  clear(root,
    h('nav', { class: 'breadcrumb', 'aria-label': 'Breadcrumb' }, h('a', { href: '#/runs' }, 'Runs'), ' / ', run.project),
    h('div', { class: 'run-head' },
      h('div', { class: 'run-title' }, h('h1', {}, run.name), el.live),
      h('div', { class: 'run-facts' }, el.step, el.processes, el.toWorkers, el.ended, el.firing)),
    el.controls, el.silences, el.banner, el.taint, el.packs,
    h('div', { class: 'run-grid' }, el.parity, el.alerts),
    el.charts, el.audit, el.workers, el.settings, el.danger);

  const state = { run, parity: undefined, alerts: [], versions: {} };
  const charts = createCharts(el.charts, runId, { rules: [], alerts: [], taint: run.taint });
  const workers = createWorkersView(el.workers, runId, workersFirst);

  function drawHead() {
    el.step.textContent = `last step ${fmt(state.run.last_step)}`;
    const counts = processCounts(state.run.components || []);
    el.processes.textContent = `processes: ${processText(counts)}`;
    el.processes.title = counts.ended ? ENDED_HELP : '';
    drawLive();
    el.ended.textContent = state.run.ended_at ? `ended ${ago(state.run.ended_at)}` : '';
    el.ended.title = when(state.run.ended_at);
    clear(el.firing, 'firing: ', severityBadges(state.run.firing_alerts, state.run.silenced_alerts));
    renderControls(el.controls, state.run, me, (control) => { adoptControl(control); drawHead(); drawBanner(); });
    drawTaint();
  }

  /** What the run trained on: the steps trained while a divergence was open. It stays after the
   *  alerts resolve (a finished run with no firing alert may still have trained on misaligned tokens). */
  let taintShown = null;
  function drawTaint() {
    const taint = state.run.taint;
    const shown = JSON.stringify(taint || null);
    if (shown === taintShown) return;
    taintShown = shown;
    charts.setContext({ taint });
    if (!taint || !taint.tainted) { clear(el.taint); return; }
    const open = (taint.ranges || []).some((r) => r.open);
    clear(el.taint, h('div', { class: 'banner banner-warn', role: 'status', dataset: { banner: 'taint' } },
      h('div', { class: 'banner-text' },
        h('strong', {}, `Trained on ${fmt(taint.steps)} tainted step${taint.steps === 1 ? '' : 's'}`),
        h('span', {}, ` — steps this run trained while a divergence was open${open ? ' (one still is)' : ''}; `,
          `a checkpoint from step ${fmt(taint.first_step)} on was trained on them. This record stays after the alerts resolve.`),
        taintSummary(taint, 10))));
  }

  function drawBanner() {
    const groups = mismatchGroups(state.parity);
    // Red banner for errors only: a warning (e.g. templates that differ in text but render alike) stays in the panel and alerts.
    const alerts = (state.alerts || []).filter((a) => a.kind === 'processor_mismatch' && a.severity === 'error' && a.status !== 'resolved');
    if (!groups.length && !alerts.length) { clear(el.banner); return; }
    const diff = groups[0]?.diff || alerts[0]?.detail?.diff;
    // The differing components, without the behaviour probes that only demonstrate one of them (diff.js, findings).
    const names = new Set(groups.flatMap((g) => findings(g.diff).components.filter((c) => c.severity === 'error').map((c) => c.name)));
    alerts.forEach((a) => findingNames(a.detail?.components || [], a.detail?.diff).forEach((n) => names.add(n)));
    const workers = groups.reduce((n, g) => n + g.components.length, 0);
    const paused = state.run.control.state !== 'running';
    const canPause = isAdmin(me) && actionAllowed('pause', state.run.control.state);
    // Sampling parameters alone do not misalign tokens: they bias the importance ratio.
    const samplingOnly = names.size > 0 && [...names].every((n) => n === 'sampling_params');
    clear(el.banner, h('div', { class: 'banner banner-error', role: 'alert', dataset: { banner: 'mismatch' } },
      h('div', { class: 'banner-text' },
        h('strong', {}, samplingOnly ? 'Sampling mismatch' : 'Processor mismatch'),
        samplingOnly
          ? h('span', {}, ' — rollout workers sample with other parameters than the trainer\'s log-prob recompute assumes: ',
            h('code', {}, 'sampling_params'), '. The importance ratio is biased while this lasts.')
          : h('span', {}, groups.length
            ? ` — ${workers} rollout worker(s) do not tokenize like the trainer: `
            : ' — a rollout processor differs from the trainer: ', h('code', {}, [...names].join(', ') || 'see diff'), '. ',
          'The loss is computed on misaligned tokens while this lasts.'),
        paused ? h('span', { class: 'banner-state' }, ` Run is ${state.run.control.state}${state.run.control.actor ? ` by ${state.run.control.actor}` : ''}.`) : null),
      h('div', { class: 'banner-actions' },
        diff ? h('button', { class: 'button', on: { click: () => openDiff(groups[0] ? groupLabel(groups[0]) : 'Processor mismatch', diff, names.has('chat_template') ? 'chat_template' : [...names][0]) } }, 'Show diff') : null,
        canPause ? h('button', { class: 'button warn', dataset: { action: 'pause' }, on: { click: async () => {
          const control = await confirmControl(runId, 'pause', state.run.name);
          if (control) { adoptControl(control); drawHead(); drawBanner(); }
        } } }, 'Pause run') : null)));
  }

  /** "These metrics look like verl's": one click enables the pack for this run (admin). */
  function drawPacks() {
    const suggested = state.run.suggested_packs || [];
    if (!suggested.length) { clear(el.packs); return; }
    const admin = isAdmin(me);
    clear(el.packs, suggested.map((s) => {
      const note = h('span', { class: 'muted small', 'aria-live': 'polite' });
      const enable = h('button', { class: 'button primary', dataset: { action: 'enable-pack', pack: s.pack }, disabled: !admin,
        title: admin ? `Add the ${s.pack} pack's rules to this run` : 'Needs the admin scope', on: { click: async () => {
          enable.disabled = true;
          try {
            const current = await api(`/runs/${runId}/settings`);
            await api(`/runs/${runId}/settings`, { method: 'PUT', body: { packs: [...new Set([...(current.packs || []), s.pack])] } });
            await refreshRun();
            reloadRules();
          } catch (err) { note.textContent = err.message; enable.disabled = false; }
        } } }, `Enable the ${s.pack} pack`);
      return h('div', { class: 'banner banner-info', role: 'status', dataset: { banner: 'pack', pack: s.pack } },
        h('div', { class: 'banner-text' }, h('strong', {}, s.message), ' ',
          h('span', { class: 'small' }, 'seen: ', s.keys.map((k, i) => [i ? ', ' : '', h('code', {}, k)]))),
        h('div', { class: 'banner-actions' }, enable, note));
    }));
  }

  async function optional(path) {
    // The run exists (it just loaded): a 404 here means this server lacks the endpoint.
    try { return await api(path); } catch (err) { if (err.status === 404 || err.status === 405) return null; throw err; }
  }

  async function loadParity() {
    try { state.parity = await optional(`/runs/${runId}/parity`); } catch (err) { state.parity = null; }
    drawParity(true);
    drawBanner();
  }

  /** The parity panel, again when it is new or when a process's state changed (a redraw would fold
   *  what the reader opened). */
  let parityStates = null;
  function drawParity(fresh = false) {
    if (state.parity === undefined) return; // not loaded yet
    const states = JSON.stringify((state.run.components || []).map((c) => [c.id, c.status]));
    if (!fresh && states === parityStates) return;
    parityStates = states;
    renderParity(el.parity, state.parity, (id) => (state.run.components.find((c) => c.id === id)?.status ?? 'live'));
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

  let runLoadedAt = Date.now();
  // Answers arrive out of order (a reload sent before a pause can land after the pause's own
  // answer or its live event): the control with the highest version is the newest and wins.
  function adoptControl(control) {
    if (control && control.version >= state.run.control.version) state.run.control = control;
  }

  function adoptRun(fresh) {
    const control = state.run.control;
    state.run = fresh;
    adoptControl(control);
  }

  async function refreshRun() {
    adoptRun(await api(`/runs/${runId}`));
    runLoadedAt = Date.now();
    drawHead();
    drawPacks();
    drawParity(); // the states of its processes
  }

  let auditLoadedAt = 0;
  let auditTimer = null;
  function loadAudit(force = false) {
    const wait = AUDIT_REFRESH_MS - (Date.now() - auditLoadedAt);
    if (!force && wait > 0) { // throttled: one trailing reload, so the last change still shows
      if (!auditTimer) auditTimer = setTimeout(() => { auditTimer = null; loadAudit(true); }, wait);
      return;
    }
    if (abort.signal.aborted) return;
    auditLoadedAt = Date.now();
    renderAudit(el.audit, runId).catch(() => {});
  }

  function refreshAll() { loadAlerts(); loadParity(); loadAudit(true); refreshRun().catch(() => {}); }

  function loadSilences() {
    renderSilences(el.silences, state.run, me, () => { loadSilences(); loadAlerts(); refreshRun().catch(() => {}); });
  }

  function onRunEvent(data) {
    const v = state.versions;
    if (data.control && data.control.version !== state.run.control.version) refreshRun().catch(() => {}); // ended_at, processes
    adoptControl(data.control);
    if (data.firing_alerts) state.run.firing_alerts = data.firing_alerts;
    if (data.last_step !== undefined && data.last_step !== state.run.last_step) {
      state.run.last_step = data.last_step;
      charts.appendLive(data.last_step);
      // New metric keys may match a framework pack: look again now and then (suggestions).
      if (Date.now() - runLoadedAt > 10000) refreshRun().catch(() => {});
      loadAudit();
    }
    if (v.alerts !== undefined && v.alerts !== data.alerts_version) { loadAlerts(); loadAudit(true); refreshRun().catch(() => {}); }
    if (v.components !== undefined && v.components !== data.components_version) { loadParity(); workers.refresh(); refreshRun().catch(() => {}); }
    if (v.silences !== undefined && v.silences !== data.silences_version) { loadSilences(); loadAlerts(); refreshRun().catch(() => {}); }
    v.alerts = data.alerts_version;
    v.components = data.components_version;
    v.silences = data.silences_version;
    drawHead();
    drawBanner();
  }

  // "● live" says the page follows a run that may still log: beside an ended run (its state and
  // "ended … ago" are in the header) a connected stream shows nothing. Trouble always shows.
  const stream = { state: 'connecting', text: 'connecting…' };
  function drawLive() {
    const quiet = stream.state === 'live' && !LIVE_RUN_STATES.has(state.run.control.state);
    el.live.dataset.live = quiet ? 'ended' : stream.state;
    el.live.textContent = quiet ? '' : stream.text;
    el.live.hidden = quiet;
  }
  const setLive = (s, text) => { stream.state = s; stream.text = text; drawLive(); };

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
        if (f !== firing) { firing = f; loadAlerts(); loadAudit(true); }
        if (c !== comps) { comps = c; loadParity(); }
        if (fresh.last_step !== state.run.last_step) { charts.appendLive(fresh.last_step); loadAudit(); }
        adoptRun(fresh);
        drawHead();
        drawBanner();
        drawPacks();
      } catch (err) {
        if (!abort.signal.aborted) setLive('reconnecting', err.status === 0 ? 'backend unreachable — retrying' : `update failed: ${err.message}`);
      }
    }, POLL_MS);
    abort.signal.addEventListener('abort', () => clearInterval(timer));
  }

  drawHead();
  drawPacks();
  loadParity();
  loadAlerts();
  loadAudit(true);
  loadSilences();
  const reloadRules = renderRunSettings(el.settings, runId, me, (rules) => charts.setContext({ rules }));
  renderDeleteZone(el.danger, state.run, me);
  followRun(runId, (name, data) => { if (name === 'run') onRunEvent(data); },
    (s) => setLive(s, { live: '● live', reconnecting: 'reconnecting…', unavailable: 'polling' }[s] || s), abort.signal)
    .then((streamed) => { if (!streamed && !abort.signal.aborted) poll(); });

  return () => { abort.abort(); clearTimeout(auditTimer); charts.destroy(); workers.destroy(); };
}

// ------------------------------------------------------------------ deleting the run (admin, two steps)

function renderDeleteZone(container, run, me) {
  const admin = isAdmin(me);
  const button = h('button', { class: 'button danger', dataset: { action: 'delete-run' }, disabled: !admin,
    title: admin ? 'Delete this run and all its data' : 'Needs a token with the admin scope',
    on: { click: () => confirmDelete(run) } }, 'Delete run…');
  clear(container, h('div', { class: 'section-head' }, h('h2', {}, 'Delete run')),
    h('p', { class: 'muted small' }, 'Removes the run with its metric points, roll-ups, alerts and webhook deliveries. ',
      'The deletion itself is kept in the audit (who, when, why).'),
    button, admin ? null : h('span', { class: 'muted small' }, ' Read-only: deleting needs the admin scope.'));
}

/** Step 1 opens this dialog; step 2 is typing the run's name, which alone enables the button. */
function confirmDelete(run) {
  const typed = h('input', { id: 'delete-confirm-name', autocomplete: 'off', spellcheck: 'false' });
  const reason = h('textarea', { id: 'delete-reason', rows: 2, maxlength: 2000, placeholder: 'Why? (optional, kept in the audit)' });
  const error = h('p', { class: 'form-error', role: 'alert' });
  const submit = h('button', { class: 'button danger', type: 'submit', disabled: true, dataset: { action: 'confirm-delete' } },
    'Delete this run');
  const live = run.control.state === 'running' && run.components.length
    ? h('p', { class: 'form-error' }, `Its ${run.components.length} process(es) may still be sending data: they will be refused (404).`)
    : null;
  const form = h('form', { class: 'control-form' },
    h('p', {}, 'Delete ', h('strong', {}, run.name), ` (project ${run.project}, last step ${fmt(run.last_step)})? `,
      'Every metric point, roll-up, alert and webhook delivery of the run goes too. This cannot be undone.'),
    live,
    h('label', { for: 'delete-confirm-name' }, 'Type the run name to confirm'), typed,
    h('label', { for: 'delete-reason' }, 'Reason'), reason, error,
    h('div', { class: 'actions' }, h('button', { class: 'button', type: 'button', on: { click: () => dialog.close() } }, 'Cancel'), submit));
  const dialog = modal('Delete run', form);
  typed.addEventListener('input', () => { submit.disabled = typed.value !== run.name; });
  typed.focus();
  form.addEventListener('submit', async (e) => {
    e.preventDefault();
    if (typed.value !== run.name) return;
    submit.disabled = true;
    try {
      await api(`/runs/${run.id}${qs({ reason: reason.value.trim() })}`, { method: 'DELETE' });
      dialog.close();
      location.hash = '#/runs';
    } catch (err) {
      submit.disabled = false;
      error.textContent = err.status === 403 ? 'Your token lacks the admin scope.' : err.message;
    }
  });
}
