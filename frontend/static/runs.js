// Runs list: name, project, state and since when, processes (live / closed / ended / lost) with heartbeat age,
// firing alerts, tainted steps (trained while a divergence was open, kept after the alerts resolve),
// last step; filter (the state filter is the server's) and sort.
import { api, qs, UI_CONFIG } from './api.js';
import { compareButton, pickBox } from './compare.js';
import { ageSeconds, ago, clear, errorState, fmt, h, severityBadges, stateBadge, taintSummary, when } from './dom.js';

// The run states, in the order of their lifecycle (docs/design.md, "Runs, processes and control").
export const RUN_STATES = UI_CONFIG.run_states;

const STALE_S = 60;
const REFRESH_MS = 5000;
const SEVERITY_RANK = { error: 3, warning: 2, info: 1 };

const SORTS = {
  name: (r) => r.name.toLowerCase(),
  project: (r) => r.project.toLowerCase(),
  state: (r) => r.control.state,
  alerts: (r) => Object.entries(r.firing_alerts || {}).reduce((acc, [s, n]) => acc + (n > 0 ? SEVERITY_RANK[s] * 1e6 + n : 0), 0),
  taint: (r) => r.taint?.steps ?? 0,
  last_step: (r) => r.last_step ?? -1,
  created: (r) => r.created_at,
};

const filters = { text: '', project: '', state: '', sort: 'created', desc: true }; // kept across visits

export function renderRuns(root) {
  const body = h('tbody');
  const status = h('p', { class: 'muted small', 'aria-live': 'polite' });
  const projectSelect = h('select', { 'aria-label': 'Project', on: { change: (e) => { filters.project = e.target.value; draw(); } } });
  const compareSlot = h('span', { class: 'compare-slot' });
  const table = h('table', { class: 'table runs-table' }, h('thead', {}, h('tr', {},
    h('th', { class: 'pick-col' }, h('span', { class: 'visually-hidden' }, 'Compare')), header('Name', 'name'), header('Project', 'project', 'hide-sm'), header('State', 'state'),
    h('th', { class: 'hide-sm' }, 'Trainer'), h('th', {}, 'Rollout'), header('Firing alerts', 'alerts'),
    header('Tainted steps', 'taint'), header('Last step', 'last_step', 'num'))), body);
  const content = h('div', { class: 'table-wrap' }, table);
  clear(root,
    h('div', { class: 'page-head' }, h('h1', {}, 'Runs'), status),
    h('div', { class: 'toolbar' },
      h('input', { type: 'search', placeholder: 'Filter by name, project or tag', 'aria-label': 'Filter runs', value: filters.text,
        on: { input: (e) => { filters.text = e.target.value.toLowerCase(); draw(); } } }),
      projectSelect,
      h('select', { 'aria-label': 'State', name: 'state', on: { change: (e) => { filters.state = e.target.value; reload(); } } },
        ['', ...RUN_STATES].map((s) => h('option', { value: s, selected: filters.state === s }, s || 'any state'))),
      compareSlot),
    content);

  let runs = [];
  let timer = null;
  let disposed = false;

  function header(label, key, cls) {
    const th = h('th', { class: ['sortable', cls], dataset: { sort: key }, tabindex: 0, 'aria-sort': 'none' }, label);
    const toggle = () => { filters.desc = filters.sort === key ? !filters.desc : key !== 'name' && key !== 'project'; filters.sort = key; draw(); };
    th.addEventListener('click', toggle);
    th.addEventListener('keydown', (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); toggle(); } });
    return th;
  }

  function visible() {
    const key = SORTS[filters.sort];
    const rows = runs.filter((r) => (!filters.project || r.project === filters.project)
      && (!filters.text || [r.name, r.project, ...Object.entries(r.tags || {}).flat()].join(' ').toLowerCase().includes(filters.text)));
    rows.sort((a, b) => { const x = key(a); const y = key(b); return (x < y ? -1 : x > y ? 1 : 0) * (filters.desc ? -1 : 1); });
    return rows;
  }

  function draw() {
    for (const th of table.querySelectorAll('th[data-sort]')) {
      th.setAttribute('aria-sort', th.dataset.sort === filters.sort ? (filters.desc ? 'descending' : 'ascending') : 'none');
    }
    const projects = [...new Set(runs.map((r) => r.project))].sort();
    clear(projectSelect, h('option', { value: '' }, 'all projects'),
      projects.map((p) => h('option', { value: p, selected: p === filters.project }, p)));
    const rows = visible();
    clear(body, rows.length ? rows.map((r) => row(r, drawCompare)) : h('tr', {}, h('td', { colspan: 9, class: 'empty' },
      runs.length || filters.state ? 'No run matches these filters.' : 'No runs yet. Point a ParityMonitor at this server to see one here.')));
    status.textContent = `${rows.length} of ${runs.length} run(s) · refreshed ${new Date().toLocaleTimeString()}`;
    drawCompare();
  }

  function drawCompare() { clear(compareSlot, compareButton(runs.map((r) => r.id))); }

  async function load() {
    clearTimeout(timer);
    const state = filters.state;
    try {
      const fresh = (await api(`/runs${qs({ state })}`)).runs;
      if (state !== filters.state) return; // the filter changed meanwhile: that load draws
      runs = fresh;
      draw();
    } catch (err) {
      if (err.status === 401) { signInFirst(err); return; }
      clear(content, errorState(err, () => { clear(content, table); load(); }));
    }
    if (!disposed) timer = setTimeout(load, REFRESH_MS);
  }

  /** Signed out: the filters would be empty and useless; say what to do instead (no refresh loop). */
  function signInFirst(err) {
    clear(root, h('div', { class: 'page-head' }, h('h1', {}, 'Runs')), errorState(err));
  }

  function reload() { clear(body); status.textContent = 'loading…'; load(); }

  load();
  if ('requestIdleCallback' in window) requestIdleCallback(() => import('./charts.js').then((m) => m.loadPlotly()).catch(() => {}));
  return () => { disposed = true; clearTimeout(timer); };
}

function row(run, onPick) {
  const trainers = run.components.filter((c) => c.side === 'trainer');
  const rollouts = run.components.filter((c) => c.side === 'rollout');
  const errors = (run.firing_alerts || {}).error > 0;
  return h('tr', { class: errors ? 'row-alert' : '', dataset: { runId: run.id, runName: run.name, tainted: run.taint?.tainted ? '1' : '0' } },
    h('td', { class: 'pick-col' }, pickBox(run, onPick)),
    h('td', {}, h('a', { class: 'run-link', href: `#/runs/${run.id}` }, run.name),
      h('div', { class: 'muted small show-sm' }, run.project)),
    h('td', { class: 'hide-sm' }, run.project),
    h('td', {}, stateBadge(run.control.state),
      h('div', { class: 'muted small since', title: when(run.control.updated_at) }, `since ${ago(run.control.updated_at)}`)),
    h('td', { class: 'hide-sm' }, componentsCell(trainers)),
    h('td', {}, componentsCell(rollouts)),
    h('td', { class: 'alerts-cell' }, severityBadges(run.firing_alerts, run.silenced_alerts)),
    h('td', { class: 'taint-cell' }, taintSummary(run.taint)),
    h('td', { class: 'num' }, fmt(run.last_step)));
}

/** Processes by the state the server shows them in: live, closed, lost, or ended (a live process of an
 *  ended run silent for the heartbeat timeout: shut down without closing). */
export function processCounts(components) {
  const counts = { live: 0, closed: 0, lost: 0, ended: 0 };
  for (const c of components) counts[c.status || 'live'] += 1;
  return counts;
}

export const ENDED_HELP = 'ended: silent since its run ended, without closing (its orchestrator shut it down, e.g. by SIGTERM); nothing to act on';

/** "3 live · 1 closed · 0 lost", and "· 2 ended" when any are (the header and the workers view). */
export function processText(counts) {
  return `${counts.live} live · ${counts.closed} closed · ${counts.lost} lost${counts.ended ? ` · ${counts.ended} ended` : ''}`;
}

function componentsCell(components) {
  if (!components.length) return h('span', { class: 'muted' }, 'none');
  const live = components.filter((c) => (c.status || 'live') === 'live');
  const counts = processCounts(components);
  const label = components.length === 1 ? components[0].worker_id : `${components.length} workers`;
  const ended = [counts.closed ? `${counts.closed} closed` : '', counts.ended ? `${counts.ended} ended` : '',
    counts.lost ? `${counts.lost} lost` : ''].filter(Boolean);
  if (!live.length) {
    return h('div', { class: 'component-cell', dataset: { processes: 'ended' } }, h('span', {}, label),
      h('span', { class: ['heartbeat', counts.lost ? 'stale' : 'ended'], title: counts.ended ? ENDED_HELP : null }, ended.join(' · ')));
  }
  const ages = live.map((c) => ageSeconds(c.last_heartbeat));
  const freshest = live[ages.indexOf(Math.min(...ages))];
  const stale = ages.filter((a) => a > STALE_S).length;
  return h('div', { class: 'component-cell' },
    h('span', {}, label),
    h('span', { class: ['heartbeat', stale || counts.lost ? 'stale' : 'fresh'], title: 'last heartbeat of a live process' },
      `♥ ${ago(freshest.last_heartbeat)}`, stale ? ` · ${stale} stale` : '', ended.length ? ` · ${ended.join(' · ')}` : ''));
}
