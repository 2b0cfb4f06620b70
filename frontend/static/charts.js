// Metric charts: every logged key grouped by prefix (pinned keys, then the keys of firing alerts, then
// the common training keys first), drawn lazily, downsampled by the server to the chart's width, zoom fetching finer buckets,
// live append, rule thresholds and alert markers.
import { api, ApiError, qs, UI_CONFIG } from './api.js';
import { clear, fmt, h } from './dom.js';

const COLORS = { error: '#c62828', warning: '#b26a00', info: '#1565c0' };
const LINE = '#2457c5';
const MAX_CONCURRENT = 4;
const MAX_POINTS = 4000;
// Below this many steps across, Plotly's automatic ticks go fractional (0.5 steps): force one per step.
const MIN_AUTO_TICK_SPAN = 10;
// What a trainer logs under these names (any prefix: "loss", "train/loss") is what people look at first.
export const COMMON_KEYS = ['loss', 'reward', 'reward_std', 'kl', 'entropy', 'grad_norm', 'learning_rate', 'epoch'];
const PINNED_STORAGE = 'paritywatch.pinned-metrics';
// A series that failed for a passing reason (server busy or unreachable) is fetched again by itself:
// waits of 1, 2, 4, 8, 16 s, then only the Retry button.
const LOAD_RETRIES = 5;
const LOAD_RETRY_BASE_MS = 1000;

let plotlyPromise = null;
/** plotly.js from the installed plotly package, at a versioned (immutable) URL. The page's
 * <link rel=preload> names it, so the 4.7 MB download starts while the HTML is parsed; without it,
 * the URL comes from the page's ui-config. */
function plotlyUrl() {
  const preload = document.querySelector('link[rel=preload][as=script][href*="/vendor/plotly-"]');
  return Promise.resolve(preload ? preload.getAttribute('href') : UI_CONFIG.plotly_url);
}

/** Plotly reads trace names, titles and hover templates as markup (<b>, <a href>) and templates
 *  (%{x}): a run name, metric key or worker id is text, so every such character goes in as an
 *  entity, which Plotly shows as itself. */
export function plotlyText(text) {
  return String(text).replace(/[&<>"'%{}]/g, (ch) => `&#${ch.charCodeAt(0)};`);
}

export function loadPlotly() {
  if (window.Plotly) return Promise.resolve(window.Plotly);
  if (!plotlyPromise) {
    plotlyPromise = plotlyUrl().then((url) => new Promise((resolve, reject) => {
      const script = document.createElement('script');
      script.src = url;
      script.onload = () => { performance.mark('paritywatch:plotly-ready'); resolve(window.Plotly); };
      script.onerror = () => reject(new Error('plotly.js could not be loaded'));
      document.head.append(script);
    })).catch((err) => { plotlyPromise = null; throw err; });
  }
  return plotlyPromise;
}

/** Pinned metric keys, in pin order; kept in this browser for every run. */
export function pinnedKeys() {
  try {
    const stored = JSON.parse(localStorage.getItem(PINNED_STORAGE) || '[]');
    return Array.isArray(stored) ? stored.filter((k) => typeof k === 'string') : [];
  } catch { return []; }
}

function setPinned(key, pinned) {
  const keys = pinnedKeys().filter((k) => k !== key);
  if (pinned) keys.push(key);
  try { localStorage.setItem(PINNED_STORAGE, JSON.stringify(keys)); } catch { /* storage full or off: pins last this page */ }
}

const leaf = (key) => key.slice(key.lastIndexOf('/') + 1);

const SEVERITY_RANK = { error: 0, warning: 1, info: 2 };

/** Metric keys named by the run's open alerts (threshold and trend rules), the most severe first. */
export function alertingKeys(alerts = []) {
  const worst = new Map();
  for (const a of alerts) {
    const key = a.detail?.key;
    if (a.status === 'resolved' || typeof key !== 'string' || (a.kind !== 'metric_threshold' && a.kind !== 'metric_trend')) continue;
    const rank = SEVERITY_RANK[a.severity] ?? 3;
    if (!worst.has(key) || rank < worst.get(key)) worst.set(key, rank);
  }
  return [...worst.keys()].sort((a, b) => worst.get(a) - worst.get(b) || a.localeCompare(b));
}

/**
 * Group metric keys: {id, label, items}. Pinned keys first (in pin order), then the keys an open
 * alert names (`alerting`, the most severe first: what a reader who came for an alert looks for,
 * above every group however long), then the common training keys (COMMON_KEYS order), then one
 * group per prefix ("align/kl_k3" → "align"): align first, then alphabetical, keys without a
 * prefix last. A key shows in one group only (a pinned key that fires stays with the pins).
 */
export function groupKeys(keys, pinned = [], alerting = []) {
  const pinRank = new Map(pinned.map((k, i) => [k, i]));
  const pins = keys.filter((k) => pinRank.has(k.key)).sort((a, b) => pinRank.get(a.key) - pinRank.get(b.key));
  const alertRank = new Map(alerting.filter((k) => !pinRank.has(k)).map((k, i) => [k, i]));
  const firing = keys.filter((k) => alertRank.has(k.key)).sort((a, b) => alertRank.get(a.key) - alertRank.get(b.key));
  const rest = keys.filter((k) => !pinRank.has(k.key) && !alertRank.has(k.key));
  const training = rest.filter((k) => COMMON_KEYS.includes(leaf(k.key)))
    .sort((a, b) => COMMON_KEYS.indexOf(leaf(a.key)) - COMMON_KEYS.indexOf(leaf(b.key)) || a.key.localeCompare(b.key));
  const byPrefix = new Map();
  for (const k of rest) {
    if (training.includes(k)) continue;
    const prefix = k.key.includes('/') ? k.key.slice(0, k.key.indexOf('/')) : '';
    if (!byPrefix.has(prefix)) byPrefix.set(prefix, []);
    byPrefix.get(prefix).push(k);
  }
  const rank = (p) => (p === 'align' ? 0 : p === '' ? 2 : 1);
  const prefixes = [...byPrefix.keys()].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  return [
    ...(pins.length ? [{ id: 'pinned', label: '★ pinned', items: pins }] : []),
    ...(firing.length ? [{ id: 'alerting', label: '▲ firing alerts', items: firing }] : []),
    ...(training.length ? [{ id: 'training', label: 'training', items: training }] : []),
    ...prefixes.map((p) => ({ id: `prefix:${p}`, prefix: p, label: p || '(no prefix)', items: byPrefix.get(p) })),
  ];
}

/** Step-axis ticks on whole steps: Plotly picks fractional ones (0.5) on a span of a few steps. */
export function stepTicks(stepMin, stepMax) {
  const span = Number(stepMax) - Number(stepMin);
  return Number.isFinite(span) && span <= MIN_AUTO_TICK_SPAN ? { tickmode: 'linear', tick0: 0, dtick: 1, tickformat: 'd' } : { tickformat: 'd' };
}

// A tiny limiter: at most MAX_CONCURRENT series requests at once, so hundreds of charts do not stampede.
let active = 0;
const waiting = [];
async function limited(fn) {
  if (active >= MAX_CONCURRENT) await new Promise((resolve) => waiting.push(resolve));
  active += 1;
  try { return await fn(); } finally { active -= 1; const next = waiting.shift(); if (next) next(); }
}

let firstPaintMarked = false;
function markFirstPaint() {
  if (firstPaintMarked) return;
  firstPaintMarked = true;
  requestAnimationFrame(() => performance.mark('paritywatch:first-chart-painted'));
}

class Chart {
  constructor(runId, meta, ctx) {
    this.runId = runId;
    this.key = meta.key;
    this.ctx = ctx;
    this.plot = h('div', { class: 'plot' }, h('p', { class: 'plot-placeholder muted small' }, 'Drawn when scrolled into view…'));
    this.caption = h('figcaption', { class: 'chart-caption muted small' }, `${fmt(meta.count)} points`);
    this.pin = h('button', { class: 'pin', type: 'button', on: { click: () => ctx.onPin?.(this.key, !this.pinned) } });
    this.setPinned(false);
    this.el = h('figure', { class: 'chart', dataset: { key: meta.key } },
      h('div', { class: 'chart-head' }, h('h3', { class: 'chart-title', title: meta.key }, meta.key),
        h('span', { class: 'chart-meta' },
          h('span', { class: 'muted small' }, meta.last_value !== undefined && meta.last_value !== null ? `last ${formatValue(meta.last_value)}` : ''),
          this.pin)),
      this.plot, this.caption);
    this.loaded = false;
    this.failures = 0; // consecutive failed loads
    this.zoomed = null; // [stepMin, stepMax] while zoomed in
    this.data = null;
  }

  setPinned(pinned) {
    this.pinned = pinned;
    this.pin.textContent = pinned ? '★' : '☆';
    this.pin.setAttribute('aria-pressed', String(pinned));
    this.pin.setAttribute('aria-label', `${pinned ? 'Unpin' : 'Pin'} ${this.key}`);
    this.pin.title = pinned ? 'Unpin' : 'Pin to the top of the metrics (kept in this browser)';
  }

  targetPoints() {
    return Math.max(50, Math.min(MAX_POINTS, Math.round(this.plot.clientWidth || 600)));
  }

  async load(range = null) {
    clearTimeout(this.retryTimer);
    this.zoomed = range;
    this.el.classList.add('loading');
    try {
      const params = { key: this.key, points: this.targetPoints(), step_min: range?.[0], step_max: range?.[1] };
      const [Plotly, data] = await Promise.all([loadPlotly(), limited(() => api(`/runs/${this.runId}/series${qs(params)}`))]);
      this.data = data;
      await this.draw(Plotly);
      this.loaded = true;
      this.failures = 0;
    } catch (err) {
      this.failed(err, range);
    } finally {
      this.el.classList.remove('loading');
    }
  }

  /** Say why the series is missing; a passing failure (busy, unreachable, plotly.js not fetched) retries by itself. */
  failed(err, range) {
    this.failures += 1;
    const passing = !(err instanceof ApiError) || err.status === 0 || err.status === 429 || err.status >= 500;
    const again = passing && this.failures <= LOAD_RETRIES;
    const wait = LOAD_RETRY_BASE_MS * 2 ** (this.failures - 1);
    if (again) this.retryTimer = setTimeout(() => this.load(range), wait);
    clear(this.plot, h('p', { class: 'chart-error', dataset: { failures: String(this.failures) } },
      `Could not load this series: ${err.message}${again ? ` Trying again in ${wait / 1000} s.` : ''} `,
      h('button', { class: 'button', type: 'button', on: { click: () => { this.failures = 0; this.load(range); } } }, 'Retry')));
  }

  traces() {
    const b = this.data.buckets;
    return [
      { x: b.step, y: b.max, name: 'max', type: 'scatter', mode: 'lines', line: { width: 0 }, hoverinfo: 'skip', showlegend: false },
      { x: b.step, y: b.min, name: 'min', type: 'scatter', mode: 'lines', line: { width: 0 }, fill: 'tonexty',
        fillcolor: 'rgba(36,87,197,0.14)', hoverinfo: 'skip', showlegend: false },
      // A line needs two points: a lone point is drawn as a marker, or the chart looks empty.
      { x: b.step, y: b.last, name: 'last', type: 'scatter', mode: b.step.length > 1 ? 'lines' : 'markers',
        line: { color: LINE, width: 1.5 }, marker: { color: LINE, size: 7 },
        hovertemplate: 'step %{x}<br>%{y:.6g}<extra></extra>' },
    ];
  }

  layout() {
    const { shapes, annotations } = decorations(this.key, this.ctx);
    const steps = this.data.buckets.step;
    const ticks = this.zoomed ? stepTicks(this.zoomed[0], this.zoomed[1]) : stepTicks(steps[0], steps[steps.length - 1]);
    return {
      // The top margin holds the alert markers (under the axis they covered its tick labels).
      height: 220, margin: { l: 52, r: 12, t: 16, b: 30 }, showlegend: false, hovermode: 'closest',
      paper_bgcolor: 'rgba(0,0,0,0)', plot_bgcolor: 'rgba(0,0,0,0)',
      font: { family: 'system-ui, -apple-system, Segoe UI, Roboto, sans-serif', size: 11, color: '#4a5160' },
      xaxis: this.zoomed ? { range: this.zoomed, autorange: false, gridcolor: '#eceef2', zeroline: false, ...ticks }
        : { autorange: true, gridcolor: '#eceef2', zeroline: false, ...ticks },
      yaxis: { autorange: true, gridcolor: '#eceef2', zeroline: false, exponentformat: 'SI' },
      shapes, annotations,
    };
  }

  async draw(Plotly) {
    const first = !this.plot.classList.contains('js-plotly-plot');
    if (first) clear(this.plot);
    this.silent = true;
    await Plotly.react(this.plot, this.traces(), this.layout(),
      { displaylogo: false, responsive: true, modeBarButtonsToRemove: ['lasso2d', 'select2d'] });
    this.silent = false;
    if (first) {
      this.plot.on('plotly_relayout', (ev) => this.onRelayout(ev));
      markFirstPaint();
    }
    this.describe();
  }

  describe() {
    const b = this.data.buckets;
    const total = b.count.reduce((a, c) => a + c, 0);
    this.el.dataset.buckets = String(b.step.length);
    this.el.dataset.bucketWidth = String(this.data.bucket_width);
    this.el.dataset.total = String(total);
    this.el.dataset.zoomed = this.zoomed ? 'true' : 'false';
    this.caption.textContent = `${fmt(total)} points in ${fmt(b.step.length)} buckets of ${fmt(this.data.bucket_width)} step(s)`
      + (this.zoomed ? ` · zoomed to steps ${fmt(this.zoomed[0])}–${fmt(this.zoomed[1])} (double-click to reset)` : ' · drag to zoom');
  }

  onRelayout(ev) {
    if (this.silent) return;
    let range = null;
    if (ev['xaxis.range[0]'] !== undefined) range = [ev['xaxis.range[0]'], ev['xaxis.range[1]']];
    else if (Array.isArray(ev['xaxis.range'])) range = ev['xaxis.range'];
    else if (!ev['xaxis.autorange']) return;
    clearTimeout(this.zoomTimer);
    this.zoomTimer = setTimeout(() => {
      this.load(range ? [Math.max(0, Math.floor(range[0])), Math.max(0, Math.ceil(range[1]))] : null);
    }, 120);
  }

  /** Fetch the buckets after the last one shown and append them (the last partial bucket is re-read). */
  async appendLive(runLastStep) {
    if (!this.loaded || this.zoomed || !this.data || this.busy) return;
    const b = this.data.buckets;
    if (!b.step.length) { this.load(); return; }
    const from = b.step[b.step.length - 1];
    if (runLastStep !== null && runLastStep !== undefined && runLastStep <= (this.data.step_max ?? -1)) return;
    if (b.step.length > 2 * this.targetPoints()) { this.load(); return; }
    this.busy = true;
    try {
      const points = Math.max(1, Math.min(MAX_POINTS, Math.ceil(((runLastStep ?? from) - from + 1) / this.data.bucket_width)));
      const tail = await limited(() => api(`/runs/${this.runId}/series${qs({ key: this.key, points, step_min: from })}`));
      if (!tail.buckets.step.length) return;
      for (const name of ['step', 'min', 'max', 'last', 'count']) b[name] = b[name].slice(0, -1).concat(tail.buckets[name]);
      this.data.step_max = tail.step_max;
      await this.draw(await loadPlotly());
    } catch { /* the next event retries */ } finally {
      this.busy = false;
    }
  }

  async redecorate() {
    if (!this.loaded) return;
    const { shapes, annotations } = decorations(this.key, this.ctx);
    this.silent = true;
    await (await loadPlotly()).relayout(this.plot, { shapes, annotations });
    this.silent = false;
  }
}

/** Rule thresholds as horizontal lines; alerts as markers on the x-axis; tainted step ranges (the
 *  run trained them while a divergence was open) shaded. Texts use enums and numbers only. */
export function decorations(key, ctx) {
  const shapes = [];
  const annotations = [];
  for (const r of ctx.taint?.ranges || []) {
    shapes.push({ type: 'rect', xref: 'x', x0: r.first_step - 0.5, x1: r.last_step + 0.5, yref: 'paper', y0: 0, y1: 1,
      fillcolor: COLORS.error, opacity: 0.08, line: { width: 0 }, layer: 'below' });
  }
  for (const rule of ctx.rules || []) {
    // a trend's or a saw-tooth's threshold is a score, not a level of the metric
    if (rule.key !== key || rule.enabled === false || rule.kind === 'trend' || rule.kind === 'sawtooth') continue;
    const color = COLORS[rule.severity] || COLORS.warning;
    shapes.push({ type: 'line', xref: 'paper', x0: 0, x1: 1, yref: 'y', y0: rule.threshold, y1: rule.threshold,
      line: { color, width: 1.2, dash: 'dash' } });
    annotations.push({ xref: 'paper', x: 1, xanchor: 'right', yref: 'y', y: rule.threshold, yanchor: 'bottom', showarrow: false,
      text: `${rule.aggregate} ${rule.comparison} ${Number(rule.threshold)} → ${rule.action}`, font: { size: 10, color } });
  }
  for (const alert of ctx.alerts || []) {
    if (alert.step === null || alert.step === undefined) continue;
    if ((alert.kind === 'metric_threshold' || alert.kind === 'metric_trend') && alert.detail?.key !== key) continue;
    const color = COLORS[alert.severity] || COLORS.info;
    shapes.push({ type: 'line', xref: 'x', x0: alert.step, x1: alert.step, yref: 'paper', y0: 0, y1: 1,
      line: { color, width: 1, dash: 'dot' }, opacity: 0.6 });
    annotations.push({ xref: 'x', x: alert.step, yref: 'paper', y: 1, yanchor: 'bottom', showarrow: false, text: '▼',
      font: { size: 11, color }, hovertext: `alert ${Number(alert.id)} · ${alert.severity} · ${alert.kind} · step ${Number(alert.step)}` });
  }
  return { shapes, annotations };
}

export function formatValue(v) {
  const n = Number(v);
  return Math.abs(n) >= 1e4 || (Math.abs(n) < 1e-3 && n !== 0) ? n.toExponential(3) : String(Number(n.toPrecision(5)));
}

/**
 * Build the charts section into `container`. ctx = {rules, alerts, taint}.
 * Returns {setContext(ctx), appendLive(lastStep), destroy()}.
 */
export function createCharts(container, runId, ctx) {
  const charts = new Map();
  const observer = new IntersectionObserver((entries) => {
    for (const e of entries) {
      if (!e.isIntersecting) continue;
      observer.unobserve(e.target);
      charts.get(e.target.dataset.key)?.load();
    }
  }, { rootMargin: '300px 0px' });
  const filter = h('input', { type: 'search', placeholder: 'Filter metrics', 'aria-label': 'Filter metrics' });
  const body = h('div', { class: 'chart-groups' }, h('p', { class: 'muted' }, 'Loading metrics…'));
  const count = h('span', { class: 'muted small' });
  clear(container, h('div', { class: 'section-head' }, h('h2', {}, 'Metrics'), count, filter), body);
  let keys = [];
  let alerting = alertingKeys(ctx.alerts); // keys of firing alerts: their charts come first
  ctx.onPin = (key, pinned) => { setPinned(key, pinned); build(); };

  function build() {
    const needle = filter.value.trim().toLowerCase();
    const shown = keys.filter((k) => !needle || k.key.toLowerCase().includes(needle));
    count.textContent = `${shown.length} of ${keys.length} key(s)`;
    if (!keys.length) { clear(body, h('p', { class: 'muted' }, 'No metrics logged yet.')); return; }
    const pinned = pinnedKeys();
    const groups = groupKeys(shown, pinned, alerting);
    clear(body, groups.map(({ id, prefix, label, items }) => {
      const grid = h('div', { class: 'chart-grid' });
      const open = id === 'pinned' || id === 'alerting' || id === 'training' || prefix === 'align' || shown.length <= 12 || Boolean(needle) || groups.length === 1;
      const details = h('details', { class: 'chart-group', open, dataset: { group: id, ...(prefix === undefined ? {} : { prefix }) } },
        h('summary', {}, h('span', { class: 'group-name' }, label), h('span', { class: 'muted small' }, `${items.length} chart(s)`)), grid);
      const fill = () => {
        if (grid.childNodes.length) return;
        for (const meta of items) {
          let chart = charts.get(meta.key);
          if (!chart) { chart = new Chart(runId, meta, ctx); charts.set(meta.key, chart); }
          chart.setPinned(pinned.includes(meta.key));
          chart.el.classList.toggle('alerting', alerting.includes(meta.key));
          grid.append(chart.el);
          if (!chart.loaded) observer.observe(chart.el);
        }
      };
      details.addEventListener('toggle', () => { if (details.open) fill(); });
      if (open) fill();
      return details;
    }));
  }

  let filterTimer = null;
  filter.addEventListener('input', () => { clearTimeout(filterTimer); filterTimer = setTimeout(build, 150); });

  async function refreshKeys() {
    const fresh = (await api(`/runs/${runId}/metrics`)).keys;
    const changed = fresh.length !== keys.length;
    keys = fresh;
    if (changed) build();
  }

  refreshKeys().catch((err) => clear(body, h('p', { class: 'chart-error' }, `Metrics are not available: ${err.message}`)));
  let keysTimer = null;
  return {
    setContext(next) {
      ctx.rules = next.rules ?? ctx.rules;
      ctx.alerts = next.alerts ?? ctx.alerts;
      ctx.taint = next.taint ?? ctx.taint;
      const nowAlerting = alertingKeys(ctx.alerts);
      if (nowAlerting.join('\n') !== alerting.join('\n')) { alerting = nowAlerting; if (keys.length) build(); }
      for (const c of charts.values()) c.redecorate();
    },
    appendLive(lastStep) {
      for (const c of charts.values()) c.appendLive(lastStep);
      clearTimeout(keysTimer);
      keysTimer = setTimeout(() => refreshKeys().catch(() => {}), 1000);
    },
    destroy() {
      observer.disconnect(); clearTimeout(keysTimer); clearTimeout(filterTimer);
      for (const c of charts.values()) clearTimeout(c.retryTimer);
    },
  };
}
