// Fingerprint diff views: side-by-side chat template diff, token tables, eos ids, vocab sizes.
// Every string here is user-supplied (chat templates are Jinja and can hold anything): text nodes only.
import { h, modal } from './dom.js';

const show = (v) => (v === null || v === undefined ? 'absent' : typeof v === 'string' ? v : JSON.stringify(v));

/** Open the diff of one rollout group (or one alert) in a dialog, `focus` component expanded first. */
export function openDiff(title, diff, focus) {
  return modal(title, renderDiff(diff, focus), { wide: true });
}

export function renderDiff(diff, focus) {
  const rows = [...((diff && diff.components) || [])];
  if (!rows.length) return h('p', { class: 'muted' }, 'No differences: the fingerprints match.');
  rows.sort((a, b) => (b.name === focus) - (a.name === focus));
  return h('div', { class: 'diff' },
    h('p', { class: 'diff-verdict' }, 'Verdict: ', h('span', { class: `badge badge-${diff.verdict}` }, diff.verdict),
      ` · ${rows.length} component(s) differ · left = trainer, right = rollout`),
    rows.map((c) => h('details', { class: `diff-component sev-${c.severity}`, open: c.name === focus || rows.length === 1,
      dataset: { component: c.name } },
    h('summary', {}, h('span', { class: `badge badge-${c.severity}` }, c.severity), h('code', {}, c.name), h('span', { class: 'summary-text' }, c.summary || '')),
    componentDetail(c))));
}

function componentDetail(c) {
  const d = c.detail || {};
  if (c.name === 'chat_template') return templateDiff(d);
  if (Array.isArray(d.rows)) return rowsTable(d.rows);
  if ('a_size' in d) return vocabDetail(d);
  if (c.name === 'generation_eos') return kvTable([['eos ids', d.a, d.b], ['pad', ...(d.pad || [])], ['bos', ...(d.bos || [])]]);
  if (Array.isArray(d.sample)) return sampleTable(d.sample, ['part', 'probe']);
  if ('a' in d || 'b' in d) return kvTable([['value', d.a, d.b]]);
  return h('pre', { class: 'json' }, JSON.stringify(d, null, 2));
}

// ------------------------------------------------------------------ chat template, side by side

export function parseUnified(text) {
  const rows = [];
  let left = [];
  let right = [];
  const flush = () => {
    for (let i = 0; i < Math.max(left.length, right.length); i++) {
      rows.push({ kind: 'change', a: left[i] ?? null, b: right[i] ?? null });
    }
    left = []; right = [];
  };
  for (const line of (text || '').split('\n')) {
    if (line.startsWith('---') || line.startsWith('+++')) continue;
    if (line.startsWith('@@')) { flush(); rows.push({ kind: 'hunk', a: line, b: line }); continue; }
    if (line.startsWith('-')) left.push(line.slice(1));
    else if (line.startsWith('+')) right.push(line.slice(1));
    else if (line.startsWith(' ')) { flush(); rows.push({ kind: 'same', a: line.slice(1), b: line.slice(1) }); }
    else if (line === '\\ No newline at end of file') continue;
  }
  flush();
  return rows;
}

function templateDiff(d) {
  const rows = parseUnified(d.unified_diff);
  if (!rows.length && ('a' in d || 'b' in d)) {
    return h('div', { class: 'sbs' }, h('pre', { class: 'code' }, show(d.a)), h('pre', { class: 'code' }, show(d.b)));
  }
  const notes = [];
  if (d.a_present === false) notes.push('The trainer has no chat template.');
  if (d.b_present === false) notes.push('The rollout worker has no chat template.');
  return h('div', {},
    notes.map((n) => h('p', { class: 'note' }, n)),
    h('div', { class: 'table-wrap' }, h('table', { class: 'sbs-table', 'aria-label': 'chat template diff' },
      h('thead', {}, h('tr', {}, h('th', {}, 'trainer'), h('th', {}, 'rollout'))),
      h('tbody', {}, rows.map(sbsRow)))));
}

function sbsRow(r) {
  if (r.kind === 'hunk') return h('tr', { class: 'hunk' }, h('td', { colspan: 2 }, r.a));
  if (r.kind === 'same') return h('tr', {}, h('td', { class: 'code' }, r.a), h('td', { class: 'code' }, r.b));
  const [a, b] = r.a !== null && r.b !== null ? highlightPair(r.a, r.b) : [[r.a ?? ''], [r.b ?? '']];
  return h('tr', { class: 'change' },
    h('td', { class: ['code', r.a === null ? 'blank' : 'del'] }, a),
    h('td', { class: ['code', r.b === null ? 'blank' : 'add'] }, b));
}

/** Mark the changed middle of two lines (common prefix and suffix stay plain). */
export function highlightPair(a, b) {
  let p = 0;
  while (p < a.length && p < b.length && a[p] === b[p]) p++;
  let s = 0;
  while (s < a.length - p && s < b.length - p && a[a.length - 1 - s] === b[b.length - 1 - s]) s++;
  const part = (x) => [x.slice(0, p), x.slice(p, x.length - s) ? h('mark', {}, x.slice(p, x.length - s)) : '', x.slice(x.length - s)];
  return [part(a), part(b)];
}

// ------------------------------------------------------------------ tables

function rowsTable(rows) {
  const label = (r) => r.token ?? r.name ?? r.key ?? r.id;
  return h('div', { class: 'table-wrap' }, h('table', { class: 'table compact' },
    h('thead', {}, h('tr', {}, h('th', {}, 'token / key'), 'id' in (rows[0] || {}) ? h('th', {}, 'id') : null,
      h('th', {}, 'trainer'), h('th', {}, 'rollout'))),
    h('tbody', {}, rows.map((r) => h('tr', {},
      h('td', {}, h('code', {}, show(label(r)))), 'id' in r ? h('td', { class: 'num' }, show(r.id)) : null,
      h('td', { class: 'code del' }, show(r.a)), h('td', { class: 'code add' }, show(r.b)))))));
}

function vocabDetail(d) {
  return h('div', {},
    kvTable([['vocab size', d.a_size, d.b_size], ['differing ids', d.differing, d.differing]]),
    d.sample && d.sample.length ? sampleTable(d.sample, ['id', 'rank']) : null);
}

function sampleTable(sample, keys) {
  const key = keys.find((k) => k in (sample[0] || {})) || keys[0];
  return h('div', { class: 'table-wrap' }, h('table', { class: 'table compact' },
    h('thead', {}, h('tr', {}, h('th', {}, key), 'part' in (sample[0] || {}) && key !== 'part' ? h('th', {}, 'part') : null,
      h('th', {}, 'trainer'), h('th', {}, 'rollout'))),
    h('tbody', {}, sample.map((r) => h('tr', {},
      h('td', {}, show(r[key])), 'part' in r && key !== 'part' ? h('td', {}, show(r.part)) : null,
      h('td', { class: 'code del' }, show(r.a)), h('td', { class: 'code add' }, show(r.b)))))));
}

function kvTable(rows) {
  return h('table', { class: 'table compact kv' },
    h('thead', {}, h('tr', {}, h('th', {}, ''), h('th', {}, 'trainer'), h('th', {}, 'rollout'))),
    h('tbody', {}, rows.map(([k, a, b]) => h('tr', { class: show(a) === show(b) ? '' : 'differs' },
      h('th', { scope: 'row' }, k), h('td', { class: 'code' }, show(a)), h('td', { class: 'code' }, show(b))))));
}
