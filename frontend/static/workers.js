// Workers view (run page): one row per process with its state, policy version and lag behind the trainer,
// last heartbeat, throughput, fingerprint group (with its diff against the trainer) and open alerts; sortable
// and filterable in the page, drawn virtually (only the rows in view are in the DOM, so 512 or 5,000 processes
// cost the same to draw). Below it, one metric per process: the outlier workers' lines over the aggregate.
import { api, qs } from './api.js';
import { formatValue, loadPlotly, plotlyText } from './charts.js';
import { openDiff } from './diff.js';
import { ago, ageSeconds, clear, fmt, h } from './dom.js';
import { ENDED_HELP, processText } from './runs.js';

const PAGE = 1000; // the endpoint's largest page: 512 processes come in one request
const ROW_H = 30; // px; fixed, so the visible slice is arithmetic
const VISIBLE_ROWS = 14;
const OVERSCAN = 6;
const STALE_S = 60;
const REFRESH_MS = 10_000;
const TOP_WORKERS = 8;
const AGGREGATE = '#9aa3b2';
const PALETTE = ['#c62828', '#2457c5', '#b26a00', '#2e7d32', '#6a1b9a', '#00838f', '#ad1457', '#4e342e'];

const byText = (f) => (a, b) => String(f(a) ?? '').localeCompare(String(f(b) ?? ''), undefined, { numeric: true });
const byNumber = (f) => (a, b) => (f(a) ?? -Infinity) - (f(b) ?? -Infinity);
const throughput = (w) => w.samples_per_s ?? w.points_per_s;
const STATE_RANK = { lost: 3, live: 2, ended: 1, closed: 0 };
const STATE_BADGE = { live: 'ok', closed: 'muted', ended: 'muted', lost: 'error' };

/** What deserves a look first: open alerts, then lost, then lagging; the most behind first among equals. */
function attention(w) {
  return (w.alerts.length ? 8 : 0) + (w.state === 'lost' ? 4 : 0) + (w.lagging ? 2 : 0) + (w.state === 'live' && ageSeconds(w.last_heartbeat) > STALE_S ? 1 : 0);
}

const BADGE_EXTRA = 22; // px around a badge's text: its padding and margin
const alertLabel = (a) => a.kind.replace(/_/g, ' ');

// `width` (px) fits the column's longest value; the others are sized to the run's longest (`fit`,
// measured, up to `max`: past it the cell's title has the whole text), and alerts takes what is left
// (at least its own). Wider than the section, the table scrolls sideways rather than cut a value.
const COLUMNS = [
  { id: 'attention', label: '!', width: 36, title: 'needs attention: alerts, lost, lagging, stale', compare: (a, b) => attention(a) - attention(b) || (a.lag ?? -1) - (b.lag ?? -1) },
  { id: 'worker', label: 'worker', fit: { texts: (w) => [w.worker_id], font: 'code', min: 110, max: 480 }, compare: byText((w) => w.worker_id) },
  { id: 'side', label: 'side', width: 76, compare: byText((w) => w.side) },
  { id: 'host', label: 'host', fit: { texts: (w) => [w.host || '—'], font: 'text', min: 80, max: 400 }, compare: byText((w) => w.host) },
  { id: 'state', label: 'state', fit: { texts: (w) => [w.state], font: 'badge', each: BADGE_EXTRA, min: 72, max: 120 }, compare: byNumber((w) => STATE_RANK[w.state]) },
  { id: 'version', label: 'version', width: 88, num: true, compare: byNumber((w) => w.policy_version) },
  { id: 'lag', label: 'lag', width: 96, num: true, title: 'versions behind the trainer', compare: byNumber((w) => w.lag) },
  { id: 'heartbeat', label: 'heartbeat', width: 100, compare: byNumber((w) => -Date.parse(w.last_heartbeat)) },
  { id: 'throughput', label: 'throughput', fit: { texts: (w) => [rateText(w)], font: 'text', min: 112, max: 200 }, num: true,
    compare: byNumber(throughput) },
  { id: 'group', label: 'fingerprint', width: 116, compare: byText((w) => w.group) },
  { id: 'alerts', label: 'alerts', flexible: true, fit: { texts: (w) => w.alerts.map(alertLabel), font: 'badge', each: BADGE_EXTRA, min: 180, max: 520 },
    compare: byNumber((w) => w.alerts.length) },
];
const CELL_PADDING = 24; // px: a cell's horizontal padding (16) and a little air

/** Widths of the `fit` columns for these rows: the widest cell, its texts measured in the cell's own
 *  font (the table's layout is fixed, so that the columns stay put while rows are drawn and removed
 *  on scroll). */
function fittedWidths(rows, fonts) {
  const ctx = (fittedWidths.canvas ||= document.createElement('canvas')).getContext('2d');
  const out = {};
  for (const col of COLUMNS.filter((c) => c.fit)) {
    ctx.font = fonts[col.fit.font];
    // The longest cells are the widest but for a few letters: measure the 50 longest only.
    const cells = [...new Set(rows.map((w) => col.fit.texts(w).join('\n')))].sort((a, b) => b.length - a.length).slice(0, 50);
    const width = (cell) => (cell ? cell.split('\n').reduce((sum, t) => sum + ctx.measureText(t).width + (col.fit.each || 0), 0) : 0);
    const widest = Math.max(0, ...cells.map(width));
    out[col.id] = Math.round(Math.min(col.fit.max, Math.max(col.fit.min, widest + CELL_PADDING)));
  }
  return out;
}

/** Every process of the run, page by page: {rows, meta (the first page: counts, groups, trainer version)}. */
async function fetchWorkers(runId, signal) {
  const rows = [];
  let cursor = null;
  let meta = null;
  do {
    const page = await api(`/runs/${runId}/workers${qs({ limit: PAGE, cursor })}`, { signal });
    meta = meta || page;
    rows.push(...page.workers);
    cursor = page.next_cursor;
  } while (cursor);
  return { rows, meta };
}

/** Start reading the processes before the run page is built (the run page passes it to createWorkersView). */
export function prefetchWorkers(runId) {
  const pending = fetchWorkers(runId);
  pending.catch(() => {}); // the view reports a failure; a page that never builds one must not log it as unhandled
  return pending;
}

export function createWorkersView(container, runId, prefetched = null) {
  if (!performance.getEntriesByName('paritywatch:workers-view-start').length) performance.mark('paritywatch:workers-view-start');
  const state = { rows: [], meta: null, parity: null, sort: { id: 'attention', dir: -1 }, filter: { state: '', side: '', group: '', text: '', lagging: false }, shown: [] };
  const abort = new AbortController();
  const el = {
    summary: h('p', { class: 'muted small workers-summary' }),
    toolbar: h('div', { class: 'toolbar workers-toolbar' }),
    scroll: h('div', { class: 'workers-scroll', style: `max-height: ${ROW_H * (VISIBLE_ROWS + 1) + 2}px` }),
    tbody: h('tbody'),
    count: h('span', { class: 'muted small', dataset: { role: 'shown' } }),
    series: h('div', { class: 'worker-series' }),
  };
  const heads = COLUMNS.map((c) => h('th', { scope: 'col', class: c.num ? 'num' : '', title: c.title || `sort by ${c.label}`, tabindex: 0,
    dataset: { sort: c.id }, on: { click: () => sortBy(c.id), keydown: (e) => { if (e.key === 'Enter' || e.key === ' ') { e.preventDefault(); sortBy(c.id); } } } }, c.label));
  const cols = COLUMNS.map((c) => h('col', { dataset: { col: c.id } }));
  const table = h('table', { class: 'table compact workers-table' }, h('colgroup', {}, cols), h('thead', {}, h('tr', {}, heads)), el.tbody);
  el.scroll.append(table);
  el.scroll.addEventListener('scroll', () => requestAnimationFrame(drawSlice), { passive: true });
  const inputs = filterInputs();
  clear(container,
    h('div', { class: 'section-head' }, h('h2', {}, 'Workers'), el.count),
    el.summary, el.toolbar, el.scroll, el.series);
  clear(el.toolbar, inputs.text, inputs.state, inputs.side, inputs.group, h('label', { class: 'small check' }, inputs.lagging, ' lagging only'));

  function filterInputs() {
    const select = (name, options) => h('select', { 'aria-label': `filter by ${name}`, dataset: { filter: name },
      on: { change: (e) => { state.filter[name] = e.target.value; apply(); } } }, options.map(([v, t]) => h('option', { value: v }, t)));
    return {
      text: h('input', { type: 'search', placeholder: 'Filter by worker or host…', 'aria-label': 'filter by worker or host', dataset: { filter: 'text' },
        on: { input: (e) => { state.filter.text = e.target.value.trim().toLowerCase(); apply(); } } }),
      state: select('state', [['', 'any state'], ['live', 'live'], ['closed', 'closed'], ['ended', 'ended'], ['lost', 'lost']]),
      side: select('side', [['', 'any side'], ['trainer', 'trainer'], ['rollout', 'rollout']]),
      group: select('group', [['', 'any fingerprint']]),
      lagging: h('input', { type: 'checkbox', dataset: { filter: 'lagging' }, on: { change: (e) => { state.filter.lagging = e.target.checked; apply(); } } }),
    };
  }

  async function load(pending = null) {
    const { rows, meta } = await (pending || fetchWorkers(runId, abort.signal));
    if (abort.signal.aborted) return;
    state.rows = rows;
    state.meta = meta;
    sizeColumns();
    drawSummary();
    drawGroupOptions();
    apply();
    if (!state.marked) {
      state.marked = true;
      requestAnimationFrame(() => performance.mark('paritywatch:workers-rendered'));
    }
  }

  /** Every column as wide as its longest value (worker ids and hosts measured over all processes). */
  function sizeColumns() {
    const probe = h('tr', { class: 'worker-row', 'aria-hidden': 'true' },
      h('td', {}, h('code', {}, 'x')), h('td', {}, 'x'), h('td', {}, h('span', { class: 'badge' }, 'x')));
    el.tbody.append(probe);
    const font = (selector) => getComputedStyle(probe.querySelector(selector)).font;
    const fonts = { code: font('code'), text: font('td:nth-child(2)'), badge: font('.badge') };
    probe.remove();
    const fitted = fittedWidths(state.rows, fonts);
    const widths = COLUMNS.map((c) => fitted[c.id] ?? c.width);
    COLUMNS.forEach((c, i) => { cols[i].style.width = c.flexible ? '' : `${widths[i]}px`; });
    table.style.minWidth = `${widths.reduce((a, b) => a + b, 0)}px`; // the flexible column keeps at least its width
  }

  function drawSummary() {
    const { counts, trainer_policy_version: version, lagging_versions: behind, groups } = state.meta;
    const lagging = state.rows.filter((w) => w.lagging).length;
    clear(el.summary, `${fmt(counts.total)} processes: ${processText(counts)} · `,
      version === null ? 'the trainer has not reported a policy version' : `trainer at version ${fmt(version)}`,
      lagging ? [' · ', h('strong', { class: 'lagging-count' }, `${lagging} lagging`), ` (≥ ${behind} versions behind)`] : '',
      ` · ${groups.length} fingerprint group${groups.length === 1 ? '' : 's'}`);
  }

  function drawGroupOptions() {
    const current = inputs.group.value;
    clear(inputs.group, h('option', { value: '' }, 'any fingerprint'),
      state.meta.groups.map((g) => h('option', { value: g.label }, `${g.label}${g.same_as_trainer ? ' (trainer’s)' : g.same_as_trainer === false ? ' (differs)' : ''} · ${g.processes}`)),
      h('option', { value: '-' }, 'none sent'));
    inputs.group.value = current;
  }

  function matches(w) {
    const f = state.filter;
    if (f.state && w.state !== f.state) return false;
    if (f.side && w.side !== f.side) return false;
    if (f.group && (w.group ?? '-') !== f.group) return false;
    if (f.lagging && !w.lagging) return false;
    return !f.text || w.worker_id.toLowerCase().includes(f.text) || w.host.toLowerCase().includes(f.text);
  }

  /** Filter and sort everything (cheap: 512 rows in well under a millisecond), then draw the slice in view. */
  function apply() {
    const col = COLUMNS.find((c) => c.id === state.sort.id);
    const dir = state.sort.dir;
    state.shown = state.rows.filter(matches).sort((a, b) => dir * col.compare(a, b) || a.component_id - b.component_id);
    heads.forEach((th) => { th.dataset.dir = th.dataset.sort === state.sort.id ? (dir > 0 ? 'asc' : 'desc') : ''; th.setAttribute('aria-sort', th.dataset.dir ? `${th.dataset.dir}ending` : 'none'); });
    el.count.textContent = `showing ${fmt(state.shown.length)} of ${fmt(state.rows.length)}`;
    el.scroll.dataset.shown = state.shown.length;
    el.scroll.scrollTop = Math.min(el.scroll.scrollTop, Math.max(0, state.shown.length * ROW_H - el.scroll.clientHeight));
    drawSlice();
  }

  function sortBy(id) {
    state.sort = { id, dir: state.sort.id === id ? -state.sort.dir : (id === 'worker' || id === 'host' || id === 'side' || id === 'group' ? 1 : -1) };
    apply();
  }

  function drawSlice() {
    const total = state.shown.length;
    const first = Math.max(0, Math.floor(el.scroll.scrollTop / ROW_H) - OVERSCAN);
    const last = Math.min(total, first + VISIBLE_ROWS + 2 * OVERSCAN);
    const spacer = (n) => (n > 0 ? h('tr', { class: 'spacer', 'aria-hidden': 'true' }, h('td', { colspan: COLUMNS.length, style: `height: ${n * ROW_H}px` })) : null);
    clear(el.tbody, total ? null : h('tr', {}, h('td', { class: 'empty', colspan: COLUMNS.length },
      state.rows.length ? 'No process matches these filters.' : 'No process has registered yet.')),
    spacer(first), state.shown.slice(first, last).map(row), spacer(total - last));
  }

  function row(w) {
    const stale = w.state === 'live' && ageSeconds(w.last_heartbeat) > STALE_S;
    return h('tr', { class: ['worker-row', w.lagging && 'row-lagging', w.state === 'lost' && 'row-lost', w.alerts.length && 'row-alert'],
      dataset: { worker: w.worker_id, state: w.state, lagging: w.lagging } },
    h('td', { class: 'attention' }, attention(w) ? h('span', { class: `dot dot-${w.alerts.some((a) => a.severity === 'error') || w.state === 'lost' ? 'error' : 'warning'}`, title: 'needs attention' }) : ''),
    h('td', { title: `${w.worker_id} · pid ${w.pid} · component ${w.component_id}` }, h('code', {}, w.worker_id)),
    h('td', {}, w.side),
    h('td', { title: w.host || null }, w.host || '—'),
    h('td', {}, h('span', { class: `badge badge-${STATE_BADGE[w.state]}`, title: w.state === 'ended' ? ENDED_HELP : null }, w.state)),
    h('td', { class: 'num' }, fmt(w.policy_version)),
    h('td', { class: 'num', dataset: { lag: w.lag ?? '' } }, w.lag === null ? '—' : w.lagging ? h('span', { class: 'badge badge-warning', title: `${w.lag} versions behind the trainer` }, `${fmt(w.lag)} behind`) : fmt(w.lag)),
    h('td', { class: stale ? 'stale' : '', title: w.last_heartbeat }, ago(w.last_heartbeat)),
    h('td', { class: 'num', title: 'over its last heartbeat interval' }, rateText(w)),
    h('td', {}, groupCell(w)),
    h('td', { title: w.alerts.map((a) => a.title).join('\n') || null },
      w.alerts.map((a) => h('span', { class: `badge badge-${a.severity}`, title: a.title }, alertLabel(a)))));
  }

  function groupCell(w) {
    if (!w.group) return h('span', { class: 'muted' }, 'none sent');
    const group = state.meta.groups.find((g) => g.label === w.group);
    const differs = group && group.same_as_trainer === false;
    return [h('span', { class: `badge badge-${differs ? 'error' : 'same'}`, title: w.fingerprint_digest }, w.group),
      differs ? h('button', { class: 'link-button small', dataset: { action: 'group-diff' }, on: { click: () => showDiff(group) } }, 'diff') : null];
  }

  async function showDiff(group) {
    try {
      state.parity = state.parity || await api(`/runs/${runId}/parity`, { signal: abort.signal });
    } catch (err) {
      if (!abort.signal.aborted) el.summary.textContent = `The diff of fingerprint ${group.label} could not be loaded: ${err.message}`;
      return;
    }
    const match = state.parity.groups.find((g) => g.digest === group.digest);
    if (match && match.diff) openDiff(`Fingerprint ${group.label} vs the trainer (${group.processes} process${group.processes === 1 ? '' : 'es'})`, match.diff);
    else el.summary.textContent = `No diff of fingerprint ${group.label} against the trainer yet: reload in a moment.`;
  }

  const timer = setInterval(() => { if (!document.hidden) refresh(); }, REFRESH_MS);
  abort.signal.addEventListener('abort', () => clearInterval(timer));

  function refresh(pending = null) {
    state.parity = null;
    return load(pending).catch((err) => { if (!abort.signal.aborted) el.summary.textContent = `Workers could not be loaded: ${err.message}`; });
  }

  const series = createWorkerSeries(el.series, runId, abort.signal);
  refresh(prefetched);
  return { refresh: () => { refresh(); series.refresh(); }, destroy: () => abort.abort() };
}

function formatRate(x) {
  return x >= 100 ? fmt(Math.round(x)) : Number(x).toPrecision(3);
}

function rateText(w) {
  if (w.samples_per_s !== null) return `${formatRate(w.samples_per_s)} samples/s`;
  return w.points_per_s !== null ? `${formatRate(w.points_per_s)} points/s` : '—';
}

// ------------------------------------------------------------------ one metric, per worker

/** Keys a per-worker view is most useful for first: what rollout workers post about themselves. */
function preferredKey(keys) {
  return keys.find((k) => k.startsWith('rollout/')) || keys.find((k) => k.startsWith('align/')) || keys[0];
}

function createWorkerSeries(container, runId, signal) {
  const select = h('select', { 'aria-label': 'metric per worker', dataset: { role: 'worker-metric' }, on: { change: draw } });
  // Per-worker lines come from raw points (roll-ups do not know the sender): a recent window by default.
  const windowSelect = h('select', { 'aria-label': 'steps', dataset: { role: 'worker-window' }, on: { change: draw } },
    [[1000, 'last 1,000 steps'], [10000, 'last 10,000 steps'], [0, 'whole run']].map(([v, t]) => h('option', { value: v }, t)));
  const plot = h('div', { class: 'plot worker-plot' });
  const note = h('p', { class: 'muted small', dataset: { role: 'worker-series-note' } });
  const lastStep = new Map();
  clear(container, h('div', { class: 'section-head' }, h('h3', {}, 'One metric per worker'), select, windowSelect,
    h('span', { class: 'muted small' }, `the ${TOP_WORKERS} workers furthest from the others, over the mean of all`)), note, plot);

  async function loadKeys() {
    const res = await api(`/runs/${runId}/metrics`, { signal });
    res.keys.forEach((k) => lastStep.set(k.key, k.last_step));
    const keys = res.keys.map((k) => k.key);
    const current = select.value;
    clear(select, keys.map((k) => h('option', { value: k }, k)));
    select.value = keys.includes(current) ? current : preferredKey(keys) || '';
    if (!keys.length) { note.textContent = 'No metrics yet.'; return; }
    await draw();
  }

  let drawSeq = 0; // the latest draw wins: an earlier one's late answer (another metric) is dropped
  async function draw() {
    const key = select.value;
    if (!key) return;
    const seq = ++drawSeq;
    const span = Number(windowSelect.value);
    const last = lastStep.get(key);
    const stepMin = span && last !== null && last !== undefined ? Math.max(0, last - span + 1) : undefined;
    let data;
    try {
      data = await api(`/runs/${runId}/workers/series${qs({ key, top: TOP_WORKERS, points: 300, step_min: stepMin })}`, { signal });
    } catch (err) {
      if (!signal.aborted && seq === drawSeq) note.textContent = err.status === 422 ? `${err.message}` : `Could not load ${key}: ${err.message}`;
      return;
    }
    if (seq !== drawSeq) return;
    container.dataset.workers = data.workers.map((w) => w.worker_id).join(',');
    note.textContent = data.workers_with_points
      ? `${data.workers_with_points} process(es) posted ${key}; median of their means ${data.workers_median === null ? '—' : formatValue(data.workers_median)}. `
        + 'Score: distance from that median in robust standard deviations.'
        + (data.unattributed_points ? ` ${fmt(data.unattributed_points)} point(s) came from batches that named no process.` : '')
      : `No point of ${key} names the process that posted it (the trainer computes it from mixed batches, or the batches named no component).`;
    const Plotly = await loadPlotly();
    if (seq !== drawSeq) return;
    const traces = [{ x: data.aggregate.step, y: data.aggregate.mean, name: 'all processes (mean)', mode: 'lines', line: { color: AGGREGATE, width: 4 } }]
      .concat(data.workers.map((w, i) => ({ x: w.buckets.step, y: w.buckets.mean, mode: 'lines', line: { color: PALETTE[i % PALETTE.length], width: 1.5 },
        name: `${plotlyText(w.worker_id)} (score ${formatValue(w.score)})` })));
    Plotly.react(plot, traces, { margin: { l: 60, r: 10, t: 10, b: 20 }, height: 280, legend: { orientation: 'h', y: -0.12, yanchor: 'top' },
      xaxis: { hoverformat: ',d' }, yaxis: { title: { text: plotlyText(key) } } }, { displayModeBar: false, responsive: true });
  }

  // Nothing is read until the section scrolls into view: the run page opens fast, whatever the run's size.
  let started = false;
  const start = () => loadKeys().catch((err) => { if (!signal.aborted) note.textContent = `Metrics could not be loaded: ${err.message}`; });
  const observer = new IntersectionObserver((entries) => {
    if (!started && entries.some((e) => e.isIntersecting)) { started = true; observer.disconnect(); start(); }
  });
  observer.observe(container);
  signal.addEventListener('abort', () => observer.disconnect());
  return { refresh: () => (started ? loadKeys().catch(() => {}) : undefined) };
}
