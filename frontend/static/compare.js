// Compare runs: two or more runs (any projects) overlaid on one metric, aligned by step or by wall time
// since each run started, with each run's parity verdict side by side. The view lives in the URL
// (#/compare?runs=1,2&metric=loss&x=step), so a link shows the same view to whoever opens it.
import { api, qs } from './api.js';
import { loadPlotly, plotlyText } from './charts.js';
import { LIVE_RUN_STATES, ago, clear, fmt, h, severityBadges, stateBadge, taintSummary } from './dom.js';

const PALETTE = ['#2457c5', '#c62828', '#2e7d32', '#8e24aa', '#ef6c00', '#00838f', '#6d4c41', '#ad1457'];
const MAX_RUNS = PALETTE.length;
const MAX_POINTS = 4000;
const X_MODES = { step: 'step', time: 'wall time since start' };
const VERDICT_RANK = { error: 4, warning: 3, info: 2, unknown: 1, same: 0 };
const RUNS_PAGE = 500;
const LIVE_MS = 10000;

// ------------------------------------------------------------------ selection on the runs list

const picked = new Set(); // run ids ticked on the runs list, kept while the list refreshes

/** The checkbox of one row of the runs list. */
export function pickBox(run, onChange) {
  return h('input', { type: 'checkbox', class: 'pick', checked: picked.has(run.id), dataset: { pick: run.id },
    'aria-label': `Select ${run.name} to compare`, on: { change: (e) => {
      if (e.target.checked) picked.add(run.id); else picked.delete(run.id);
      onChange();
    } } });
}

/** The runs list's "Compare" button: enabled with two runs ticked or more (among `shownIds`). */
export function compareButton(shownIds) {
  const ids = [...picked].filter((id) => shownIds.includes(id)).slice(0, MAX_RUNS);
  return h('button', { class: ['button', ids.length >= 2 ? 'primary' : ''], dataset: { action: 'compare' }, disabled: ids.length < 2,
    title: ids.length >= 2 ? `Overlay the metrics of these ${ids.length} runs` : 'Tick two runs or more to compare them',
    on: { click: () => { location.hash = compareHash({ runs: ids }); } } }, `Compare${ids.length ? ` (${ids.length})` : ''}`);
}

// ------------------------------------------------------------------ the URL

export function compareHash({ runs = [], metric = '', x = 'step' }) {
  const p = new URLSearchParams();
  if (runs.length) p.set('runs', runs.join(','));
  if (metric) p.set('metric', metric);
  if (x !== 'step') p.set('x', x);
  const s = p.toString().replace(/%2C/g, ',');
  return `#/compare${s ? `?${s}` : ''}`;
}

export function parseCompare(query) {
  const p = new URLSearchParams(query || '');
  const runs = [...new Set((p.get('runs') || '').split(',').map((s) => Number(s.trim()))
    .filter((n) => Number.isInteger(n) && n > 0))].slice(0, MAX_RUNS);
  return { runs, metric: p.get('metric') || '', x: X_MODES[p.get('x')] ? p.get('x') : 'step' };
}

// ------------------------------------------------------------------ the page

export async function renderCompare(root, query) {
  const view = parseCompare(query);
  const el = {
    picker: h('div', { class: 'compare-picker' }),
    controls: h('div', { class: 'toolbar compare-controls' }),
    plot: h('div', { class: 'compare-plot' }),
    caption: h('p', { class: 'muted small compare-caption', 'aria-live': 'polite' }),
    verdicts: h('div', { class: 'table-wrap compare-verdicts' }),
  };
  clear(root,
    h('div', { class: 'page-head' }, h('h1', {}, 'Compare runs'),
      h('p', { class: 'muted small' }, 'Overlay one metric of several runs, aligned by step or by wall time since each run started.')),
    h('section', { class: 'card' }, el.picker, el.controls,
      h('figure', { class: 'chart compare-chart' }, el.plot, el.caption)),
    h('section', { class: 'card' }, h('div', { class: 'section-head' }, h('h2', {}, 'Side by side')), el.verdicts));

  const abort = new AbortController();
  const state = { all: [], runs: new Map(), keys: new Map(), parity: new Map(), times: new Map() };
  const get = (path) => api(path, { signal: abort.signal });

  function setView(next) {
    Object.assign(view, next);
    history.replaceState(null, '', compareHash(view)); // no hashchange: the page stays, only what changed reloads
  }

  async function loadRuns() {
    const missing = view.runs.filter((id) => !state.runs.has(id));
    const fetched = await Promise.all(missing.map((id) => get(`/runs/${id}`).catch((err) => {
      if (err.status !== 404) throw err; // signed out, not allowed, server down: the page says so
      return { id, error: err };
    })));
    for (const r of fetched) state.runs.set(r.id, r);
    // another call may still be fetching a run added since: only runs already here (and found) load keys
    await Promise.all(view.runs.filter((id) => !state.keys.has(id) && state.runs.has(id) && !state.runs.get(id).error).map(async (id) => {
      const [keys, parity] = await Promise.all([get(`/runs/${id}/metrics`), get(`/runs/${id}/parity`).catch(() => null)]);
      state.keys.set(id, keys.keys);
      state.parity.set(id, parity);
    }));
  }

  function chosen() { return view.runs.map((id) => state.runs.get(id)).filter((r) => r && !r.error); }

  function drawPicker() {
    const selected = new Set(view.runs);
    const options = state.all.filter((r) => !selected.has(r.id));
    const select = h('select', { 'aria-label': 'Add a run', dataset: { picker: 'add' } },
      h('option', { value: '' }, options.length ? 'add a run…' : 'no other run'),
      groupByProject(options).map(([project, runs]) => h('optgroup', { label: project },
        runs.map((r) => h('option', { value: r.id }, `${r.name} (#${r.id})`)))));
    select.addEventListener('change', () => {
      const id = Number(select.value);
      if (!id || view.runs.length >= MAX_RUNS) return;
      setView({ runs: [...view.runs, id] });
      refresh();
    });
    clear(el.picker, h('div', { class: 'chips', 'aria-label': 'Runs compared' },
      view.runs.map((id, i) => {
        const run = state.runs.get(id);
        const label = !run ? `run ${id}` : run.error ? `run ${id} (not found)`
          : `${run.name} · ${run.project}`;
        return h('span', { class: ['chip', run?.error ? 'chip-bad' : ''], dataset: { compareRun: id } },
          h('span', { class: 'swatch', style: `background:${PALETTE[i % PALETTE.length]}`, 'aria-hidden': 'true' }),
          run && !run.error ? h('a', { href: `#/runs/${id}` }, label) : label,
          h('button', { class: 'icon-button', title: 'Remove from the comparison', 'aria-label': `Remove ${label}`,
            on: { click: () => { setView({ runs: view.runs.filter((x) => x !== id) }); refresh(); } } }, '×'));
      }),
      view.runs.length < MAX_RUNS ? select : h('span', { class: 'muted small' }, `at most ${MAX_RUNS} runs`)));
  }

  function drawControls() {
    const [shared, partial] = metricChoices(view.runs.map((id) => state.keys.get(id)).filter(Boolean));
    if (!view.metric || ![...shared, ...partial].includes(view.metric)) view.metric = defaultMetric(shared, partial);
    const metric = h('select', { id: 'compare-metric', dataset: { picker: 'metric' } },
      shared.length ? h('optgroup', { label: 'logged by every run' }, shared.map((k) => h('option', { value: k, selected: k === view.metric }, k))) : null,
      partial.length ? h('optgroup', { label: 'logged by some runs' }, partial.map((k) => h('option', { value: k, selected: k === view.metric }, k))) : null);
    metric.addEventListener('change', () => { setView({ metric: metric.value }); redraw(); drawVerdicts(); });
    const axis = h('div', { class: 'segmented', role: 'radiogroup', 'aria-label': 'Align by' },
      Object.entries(X_MODES).map(([mode, label]) => h('label', {},
        h('input', { type: 'radio', name: 'compare-x', value: mode, checked: view.x === mode,
          on: { change: () => { setView({ x: mode }); redraw(); } } }), ` ${label}`)));
    clear(el.controls, h('label', { class: 'muted small', for: 'compare-metric' }, 'metric '), metric, h('span', { class: 'muted small' }, 'align by'), axis);
    history.replaceState(null, '', compareHash(view));
  }

  /** drawChart with its failure shown in the chart's place. */
  function redraw(range = null) {
    return drawChart(range).catch((err) => {
      if (!abort.signal.aborted) showMessage(h('p', { class: 'chart-error' }, `Could not load the series: ${err.message}`));
    });
  }

  let drawSeq = 0;
  let drawing = false;
  let graph = null; // the Plotly div, once drawn
  let zoomed = null; // the step range while zoomed in
  async function drawChart(range = null) {
    const seq = ++drawSeq;
    zoomed = range;
    const runs = chosen();
    if (runs.length < 1 || !view.metric) {
      showMessage(h('p', { class: 'plot-placeholder muted' }, runs.length ? 'These runs have no metric yet.' : 'Add two runs or more to compare them.'));
      return;
    }
    el.plot.classList.add('loading');
    const points = Math.max(50, Math.min(MAX_POINTS, Math.round(el.plot.clientWidth || 800)));
    try {
      await plotSeries(seq, runs, points, range);
    } finally {
      el.plot.classList.remove('loading');
    }
  }

  /** A fresh Plotly div after a message replaced the last one (a purged div is not reused). */
  function graphDiv() {
    if (!graph) {
      graph = h('div', { class: 'plot', dataset: { compare: 'plot' } });
      clear(el.plot, graph);
    }
    return graph;
  }

  function showMessage(message) {
    if (graph && window.Plotly) window.Plotly.purge(graph);
    graph = null;
    clear(el.plot, message);
    el.caption.textContent = '';
  }

  async function plotSeries(seq, runs, points, range) {
    const series = await Promise.all(runs.map((run) => readSeries(run, points, range)));
    if (seq !== drawSeq) return;
    const traces = runs.map((run, i) => trace(run, series[i], PALETTE[view.runs.indexOf(run.id) % PALETTE.length]));
    const Plotly = await loadPlotly();
    if (seq !== drawSeq) return;
    const div = graphDiv();
    const fresh = !div.classList.contains('js-plotly-plot');
    drawing = true; // a redraw's own relayout is not a zoom
    try {
      await Plotly.react(div, traces.filter(Boolean), layout(range), { displaylogo: false, responsive: true,
        modeBarButtonsToRemove: ['lasso2d', 'select2d'] });
    } finally {
      drawing = false;
    }
    div.dataset.metric = view.metric;
    div.dataset.x = view.x;
    if (fresh) div.on('plotly_relayout', onZoom);
    const absent = runs.filter((r, i) => !series[i]).map((r) => r.name);
    const timeless = runs.filter((r, i) => series[i] && view.x === 'time' && !series[i].x.length && series[i].count).map((r) => r.name);
    el.caption.textContent = [
      `${view.metric}: last value per bucket, ${fmt(points)} buckets at most per run`,
      view.x === 'time' ? 'x = seconds since each run was created (when the server received each batch)' : 'x = step',
      absent.length ? `not logged by ${absent.join(', ')}` : '',
      timeless.length ? `no batch times kept for ${timeless.join(', ')} (raw points past retention)` : '',
      range ? 'zoomed (double-click to reset)' : 'drag to zoom',
    ].filter(Boolean).join(' · ');
  }

  let zoomTimer = null;
  function onZoom(ev) {
    if (drawing || view.x !== 'step') return; // time zoom stays client-side: the buckets are per step
    let range = null;
    if (ev['xaxis.range[0]'] !== undefined) range = [ev['xaxis.range[0]'], ev['xaxis.range[1]']];
    else if (!ev['xaxis.autorange']) return;
    clearTimeout(zoomTimer);
    zoomTimer = setTimeout(() => redraw(range && [Math.max(0, Math.floor(range[0])), Math.max(0, Math.ceil(range[1]))]), 150);
  }

  async function readSeries(run, points, range) {
    if (!(state.keys.get(run.id) || []).some((k) => k.key === view.metric)) return null;
    const data = await get(`/runs/${run.id}/series${qs({ key: view.metric, points, step_min: range?.[0], step_max: range?.[1] })}`);
    const b = data.buckets;
    const count = b.count.reduce((a, c) => a + c, 0);
    if (view.x === 'step') return { x: b.step, y: b.last, count };
    const times = await stepTimes(run);
    const x = [];
    const y = [];
    b.step.forEach((step, i) => { const t = secondsAt(times, step); if (t !== null) { x.push(t); y.push(b.last[i]); } });
    return { x, y, count };
  }

  async function stepTimes(run) {
    if (!state.times.has(run.id)) {
      state.times.set(run.id, get(`/runs/${run.id}/series/times${qs({ key: view.metric, points: MAX_POINTS })}`)
        .catch((err) => { state.times.delete(run.id); throw err; }));
    }
    const times = await state.times.get(run.id);
    return times.key === view.metric ? times : (state.times.delete(run.id), stepTimes(run));
  }

  function trace(run, s, color) {
    if (!s) return null;
    return { x: s.x, y: s.y, name: plotlyText(run.name), type: 'scatter', mode: s.x.length === 1 ? 'markers' : 'lines',
      line: { color, width: 1.6 }, marker: { color, size: 6 },
      hovertemplate: `${plotlyText(run.name)} (#${run.id})<br>${view.x === 'step' ? 'step' : 't = '}%{x}${view.x === 'step' ? '' : ' s'}<br>%{y:.6g}<extra></extra>` };
  }

  function layout(range) {
    const axis = { gridcolor: '#eceef2', zeroline: false };
    return {
      height: 380, margin: { l: 56, r: 12, t: 8, b: 40 }, hovermode: 'closest', showlegend: true,
      legend: { orientation: 'h', y: -0.18 }, paper_bgcolor: 'rgba(0,0,0,0)', plot_bgcolor: 'rgba(0,0,0,0)',
      font: { family: 'system-ui, -apple-system, Segoe UI, Roboto, sans-serif', size: 11, color: '#4a5160' },
      xaxis: { ...axis, title: { text: view.x === 'step' ? 'step' : 'seconds since the run was created' },
        tickformat: view.x === 'step' ? 'd' : undefined, ...(range ? { range, autorange: false } : { autorange: true }) },
      yaxis: { ...axis, autorange: true, exponentformat: 'SI', title: { text: plotlyText(view.metric) } },
    };
  }

  function drawVerdicts() {
    const runs = view.runs.map((id) => state.runs.get(id)).filter(Boolean);
    if (!runs.length) { clear(el.verdicts, h('p', { class: 'muted' }, 'No run chosen yet.')); return; }
    const cols = runs.map((run) => ({ run, parity: state.parity.get(run.id), keys: state.keys.get(run.id) || [] }));
    const row = (label, cell) => h('tr', {}, h('th', { scope: 'row' }, label), cols.map((c) => h('td', {}, c.run.error ? '—' : cell(c))));
    clear(el.verdicts, h('table', { class: 'table compare-table' },
      h('thead', {}, h('tr', {}, h('th', {}, ''), cols.map((c, i) => h('th', { scope: 'col', dataset: { compareRun: c.run.id } },
        h('span', { class: 'swatch', style: `background:${PALETTE[i % PALETTE.length]}`, 'aria-hidden': 'true' }),
        c.run.error ? `run ${c.run.id}` : h('a', { href: `#/runs/${c.run.id}` }, c.run.name))))),
      h('tbody', {},
        row('project', (c) => c.run.project),
        row('state', (c) => stateBadge(c.run.control.state)),
        row('parity verdict', (c) => verdictCell(c.parity)),
        row('firing alerts', (c) => severityBadges(c.run.firing_alerts, c.run.silenced_alerts)),
        row('tainted steps', (c) => taintSummary(c.run.taint, 3)),
        row('last step', (c) => fmt(c.run.last_step)),
        row(h('code', {}, view.metric || 'metric'), (c) => lastValue(c.keys, view.metric)),
        row('created', (c) => ago(c.run.created_at)))));
  }

  async function refresh(first = false) {
    drawPicker();
    try {
      await loadRuns();
    } catch (err) {
      if (first) throw err; // the router shows it, with a sign-in or retry button
      if (abort.signal.aborted) return;
      showMessage(h('p', { class: 'chart-error' }, `Could not load the runs: ${err.message}`));
      return;
    }
    drawPicker();
    drawControls();
    drawVerdicts();
    redraw();
  }

  loadPlotly().catch(() => {});
  get(`/runs${qs({ limit: RUNS_PAGE })}`).then((res) => { state.all = res.runs; drawPicker(); }).catch(() => {});
  await refresh(true);
  /** Runs that may still log are re-read every LIVE_MS (not while zoomed or hidden): their new steps
   *  extend the chart; their verdicts follow a fingerprint change. */
  let liveTimer = null;
  async function followLive() {
    const live = chosen().filter((r) => LIVE_RUN_STATES.has(r.control.state));
    if (live.length && !zoomed && !document.hidden) {
      try {
        const keysBefore = keyNames();
        await Promise.all(live.map(refreshRun));
        if (keyNames() !== keysBefore) drawControls(); // a metric first logged after the page opened
        drawVerdicts();
        if (!zoomed) await drawChart(); // the user may have zoomed in while the runs were re-read
      } catch { /* the next round retries */ }
    }
    if (!abort.signal.aborted) liveTimer = setTimeout(followLive, LIVE_MS);
  }

  const keyNames = () => JSON.stringify(view.runs.map((id) => (state.keys.get(id) || []).map((k) => k.key)));

  async function refreshRun(run) {
    const fresh = await get(`/runs/${run.id}`);
    const digests = (r) => JSON.stringify((r.components || []).map((c) => [c.id, c.fingerprint_digest]));
    if (digests(fresh) !== digests(run)) state.parity.set(run.id, await get(`/runs/${run.id}/parity`).catch(() => null));
    if (fresh.last_step !== run.last_step) {
      state.keys.set(run.id, (await get(`/runs/${run.id}/metrics`)).keys);
      state.times.delete(run.id);
    }
    state.runs.set(run.id, fresh);
  }

  liveTimer = setTimeout(followLive, LIVE_MS);
  return () => { abort.abort(); clearTimeout(zoomTimer); clearTimeout(liveTimer); };
}

// ------------------------------------------------------------------ small pure helpers

function groupByProject(runs) {
  const groups = new Map();
  for (const r of runs) {
    if (!groups.has(r.project)) groups.set(r.project, []);
    groups.get(r.project).push(r);
  }
  return [...groups.entries()].sort(([a], [b]) => a.localeCompare(b));
}

/** [keys every run logs, keys only some log], each sorted by name. */
export function metricChoices(keyLists) {
  const counts = new Map();
  for (const keys of keyLists) for (const k of new Set(keys.map((x) => x.key))) counts.set(k, (counts.get(k) || 0) + 1);
  const all = [...counts.keys()].sort();
  return [all.filter((k) => counts.get(k) === keyLists.length), all.filter((k) => counts.get(k) < keyLists.length)];
}

const PREFERRED = ['loss', 'train/loss', 'reward/mean', 'align/kl_k3'];

function defaultMetric(shared, partial) {
  return PREFERRED.find((k) => shared.includes(k)) || shared[0] || partial[0] || '';
}

/** The worst verdict of a run's rollout groups, with how many workers it covers. */
export function runVerdict(parity) {
  if (!parity) return { verdict: 'unknown', text: 'not available' };
  if (!parity.trainer) return { verdict: 'unknown', text: 'no trainer fingerprint' };
  const groups = parity.groups || [];
  if (!groups.length) return { verdict: 'unknown', text: 'no rollout fingerprint' };
  const worst = groups.reduce((w, g) => ((VERDICT_RANK[g.verdict] ?? 1) > (VERDICT_RANK[w.verdict] ?? 1) ? g : w), groups[0]);
  const workers = groups.reduce((n, g) => n + g.components.length, 0);
  const differing = groups.filter((g) => g.verdict !== 'same').reduce((n, g) => n + g.components.length, 0);
  const names = [...new Set(groups.flatMap((g) => (g.diff?.components || []).filter((c) => c.severity === worst.verdict).map((c) => c.name)))];
  const text = worst.verdict === 'same' ? `all ${workers} rollout worker(s) match the trainer`
    : `${differing} of ${workers} rollout worker(s) differ${names.length ? `: ${names.join(', ')}` : ''}`;
  return { verdict: worst.verdict, text };
}

function verdictCell(parity) {
  const { verdict, text } = runVerdict(parity);
  return h('div', { class: 'verdict', dataset: { verdict } }, h('span', { class: `badge badge-${verdict === 'same' ? 'ok' : verdict}` }, verdict),
    h('div', { class: 'muted small' }, text));
}

function lastValue(keys, metric) {
  const k = keys.find((x) => x.key === metric);
  if (!k) return h('span', { class: 'muted' }, 'not logged');
  return `${k.last_value === null || k.last_value === undefined ? '—' : Number(Number(k.last_value).toPrecision(5))} at step ${fmt(k.last_step)}`;
}

/** Seconds since the run was created at `step`: linear between the batches that carried the metric
 *  (times = {steps, seconds}, sorted by step); null when no batch time is known. */
export function secondsAt(times, step) {
  const s = times.steps;
  if (!s.length) return null;
  if (step <= s[0]) return times.seconds[0];
  let lo = 0;
  let hi = s.length - 1;
  if (step >= s[hi]) return times.seconds[hi];
  while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (s[mid] <= step) lo = mid; else hi = mid; }
  const f = (step - s[lo]) / (s[hi] - s[lo]);
  return times.seconds[lo] + f * (times.seconds[hi] - times.seconds[lo]);
}
