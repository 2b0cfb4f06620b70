// Fingerprint diff views: side-by-side chat template diff, behaviour probes, token tables, eos ids, vocab sizes.
// Every string here is user-supplied (chat templates are Jinja and can hold anything): text nodes only.
import { h, modal } from './dom.js';

const show = (v) => (v === null || v === undefined ? 'absent' : typeof v === 'string' ? v : JSON.stringify(v));

/** Open the diff of one rollout group (or one alert) in a dialog, `focus` component expanded first. */
export function openDiff(title, diff, focus) {
  return modal(title, renderDiff(diff, focus ?? diffFocus(diff)), { wide: true });
}

/** The component to open first: the chat template when it differs (the most readable cause), else the first row. */
export function diffFocus(diff) {
  const names = findings(diff).components.map((c) => c.name);
  return names.includes('chat_template') ? 'chat_template' : names[0];
}

// ------------------------------------------------------------------ behaviour probes as evidence

// A differing behaviour probe demonstrates another component's difference: a conversation rendered
// differently, the chat template's (or, when the templates agree, a tokenizer table's); a text
// encoded or decoded differently, the first differing tokenizer table's. Shown under that component,
// not as a second finding. A difference no differing component explains stays a finding of its own.
// The diff marks this (`evidence_of` on the behavior row, the one rule the backend's texts use too);
// the order below is that rule's, for diffs stored before the mark.
const TOKENIZER_TABLES = ['added_tokens', 'special_tokens', 'vocab', 'merges', 'normalizer', 'pre_tokenizer',
  'post_processor', 'decoder', 'encode_flags', 'model_params'];
const PART_EXPLAINED_BY = { chat: ['chat_template', ...TOKENIZER_TABLES], encode: TOKENIZER_TABLES,
  encode_no_special: TOKENIZER_TABLES, decode: TOKENIZER_TABLES };
const PART_TEXT = {
  chat: ['rendered differently in', 'probe conversation'], encode: ['encoded differently in', 'probe text'],
  encode_no_special: ['encoded differently (without special tokens) in', 'probe text'], decode: ['decoded differently in', 'probe text'],
};

/** {components: the diff's findings, evidence: {component name: [{part, labels, rows}]}}: `behavior`
 *  is left out of the findings when another differing component explains each of its differing parts. */
export function findings(diff) {
  const components = (diff && diff.components) || [];
  const behavior = components.find((c) => c.name === 'behavior');
  const probes = behavior && behavior.detail && behavior.detail.differing_probes;
  if (!probes || !Object.keys(probes).length) return { components, evidence: {} };
  const present = new Set(components.map((c) => c.name));
  const marked = behavior.evidence_of; // the diff's own mark (trainer_hooks/fingerprint/diff.py); absent in older diffs
  const evidence = {};
  for (const [part, labels] of Object.entries(probes)) {
    const by = marked ? marked[part] : (PART_EXPLAINED_BY[part] || []).find((n) => present.has(n));
    if (!by) return { components, evidence: {} };
    (evidence[by] ||= []).push({ part, labels, rows: (behavior.detail.sample || []).filter((r) => r.part === part) });
  }
  return { components: components.filter((c) => c !== behavior), evidence };
}

/** Component names (an alert's list) without those `diff` shows as evidence only. */
export function findingNames(names, diff) {
  if (!diff) return names;
  const found = new Set(findings(diff).components.map((c) => c.name));
  return names.filter((n) => found.has(n));
}

/** "rendered differently in 18 of 18 probe conversations" (M known for conversations a template renders). */
export function evidenceText(item, component) {
  // A conversation a tokenizer table explains renders alike and tokenizes differently.
  const tokenized = item.part === 'chat' && component && component.name !== 'chat_template';
  const [verb, noun] = tokenized ? ['tokenized differently in', 'probe conversation'] : PART_TEXT[item.part] || [`differ (${item.part}) in`, 'probe'];
  const n = item.labels.length;
  const of = item.part === 'chat' && component && component.detail && component.detail.renders ? component.detail.renders.compared : null;
  return `${verb} ${n}${of ? ` of ${of}` : ''} ${noun}${(of ?? n) === 1 ? '' : 's'}`;
}

/** What the behaviour probes show of this component's difference: the counts and their probe rows
 *  (`shownRow`, already shown above by the template view, left out). */
function evidenceBlock(items, component, shownRow) {
  const rows = items.flatMap((i) => i.rows).filter((r) => r !== shownRow);
  return h('div', { class: 'evidence', dataset: { evidence: component.name } },
    h('p', { class: 'evidence-head' }, h('strong', {}, 'Evidence'), ' from the behaviour probes: ',
      items.map((i, k) => [k ? '; ' : '', evidenceText(i, component)]), '.'),
    rows.length ? h('details', { class: 'evidence-probes', open: !shownRow },
      h('summary', {}, shownRow ? `${rows.length} more differing probe(s)` : `the differing probe(s) (${rows.length} shown)`),
      probeTable(rows)) : null);
}

export function renderDiff(diff, focus) {
  const { components, evidence } = findings(diff);
  const rows = [...components];
  if (!rows.length) return h('p', { class: 'muted' }, 'No differences: the fingerprints match.');
  rows.sort((a, b) => (b.name === focus) - (a.name === focus));
  const causes = (diff && diff.causes) || [];
  return h('div', { class: 'diff' },
    h('p', { class: 'diff-verdict' }, 'Verdict: ', h('span', { class: `badge badge-${diff.verdict}` }, diff.verdict),
      ` · ${rows.length} component(s) differ · left = trainer, right = rollout`),
    causes.length ? h('ul', { class: 'diff-causes' }, causes.map((c) => h('li', { dataset: { cause: c.cause } },
      h('strong', {}, 'Likely cause: '), c.summary))) : null,
    rows.map((c) => h('details', { class: `diff-component sev-${c.severity}`, open: c.name === focus || rows.length === 1,
      dataset: { component: c.name } },
    h('summary', {}, h('span', { class: `badge badge-${c.severity}` }, c.severity), h('code', {}, c.name), h('span', { class: 'summary-text' }, c.summary || '')),
    componentDetail(c, diff, evidence[c.name]))));
}

function componentDetail(c, diff, evidence) {
  if (c.name === 'chat_template') {
    const shown = firstRenderedProbe(diff);
    return h('div', {}, templateDiff(c.detail || {}, renderedProbe(diff)), evidence ? evidenceBlock(evidence, c, shown) : null);
  }
  return evidence ? h('div', {}, detailOf(c), evidenceBlock(evidence, c, null)) : detailOf(c);
}

function detailOf(c) {
  const d = c.detail || {};
  if (c.name === 'behavior' && Array.isArray(d.sample)) return behaviorDetail(d);
  if (c.name === 'sampling_params' && Array.isArray(d.rows)) return samplingDetail(d.rows);
  if (Array.isArray(d.rows)) return rowsTable(d.rows);
  if ('a_size' in d) return vocabDetail(d);
  if (c.name === 'generation_eos') return kvTable([['eos ids', d.a, d.b], ['pad', ...(d.pad || [])], ['bos', ...(d.bos || [])]]);
  if (Array.isArray(d.sample)) return sampleTable(d.sample, ['part', 'probe']);
  if ('a' in d || 'b' in d) return kvTable([['value', d.a, d.b]]);
  return h('pre', { class: 'json' }, JSON.stringify(d, null, 2));
}

// ------------------------------------------------------------------ unified diff → side by side

const HUNK = /^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@/;

/**
 * Parse a unified diff (one or more files) into side-by-side rows:
 * {kind: 'file'|'hunk'|'same'|'change', a, b, aLine, bLine, aNoEol, bNoEol}.
 * Hunk line counts decide what is content, so a template line starting with "--", "++" or "@@" stays content;
 * "\ No newline at end of file" marks the line before it.
 */
export function parseUnified(text) {
  const rows = [];
  let left = [];
  let right = [];
  let oldLeft = 0;
  let newLeft = 0;
  let aNo = 0;
  let bNo = 0;
  let fromFile = null;
  let lastLine = null; // the content entry a "\ No newline" marker refers to
  const flush = () => {
    for (let i = 0; i < Math.max(left.length, right.length); i++) {
      const a = left[i];
      const b = right[i];
      rows.push({ kind: 'change', a: a ? a.text : null, b: b ? b.text : null, aLine: a ? a.n : null, bLine: b ? b.n : null,
        aNoEol: Boolean(a && a.noEol), bNoEol: Boolean(b && b.noEol) });
    }
    left = []; right = [];
  };
  for (const line of (text || '').split('\n')) {
    if (line.startsWith('\\')) {
      if (lastLine) lastLine.noEol = true;
      continue;
    }
    if (oldLeft > 0 || newLeft > 0) {
      const tag = line[0] ?? ' '; // a bare empty line is an empty context line (trimmed by some tools)
      const body = line.slice(1);
      if (tag === '-') { lastLine = { text: body, n: ++aNo }; left.push(lastLine); oldLeft--; continue; }
      if (tag === '+') { lastLine = { text: body, n: ++bNo }; right.push(lastLine); newLeft--; continue; }
      flush();
      const row = { kind: 'same', a: body, b: body, aLine: ++aNo, bLine: ++bNo, aNoEol: false, bNoEol: false };
      rows.push(row);
      lastLine = { set noEol(v) { row.aNoEol = v; row.bNoEol = v; } };
      oldLeft--; newLeft--;
      continue;
    }
    flush();
    lastLine = null;
    const hunk = HUNK.exec(line);
    if (hunk) {
      oldLeft = hunk[2] === undefined ? 1 : Number(hunk[2]);
      newLeft = hunk[4] === undefined ? 1 : Number(hunk[4]);
      aNo = Number(hunk[1]) - (oldLeft ? 1 : 0);
      bNo = Number(hunk[3]) - (newLeft ? 1 : 0);
      rows.push({ kind: 'hunk', a: line, b: line });
    } else if (line.startsWith('--- ')) {
      fromFile = line.slice(4);
    } else if (line.startsWith('+++ ')) {
      rows.push({ kind: 'file', a: fromFile, b: line.slice(4) });
    }
  }
  flush();
  return rows;
}

function templateDiff(d, rendered) {
  const rows = parseUnified(d.unified_diff);
  if (!rows.length && ('a' in d || 'b' in d)) {
    return h('div', { class: 'sbs' }, h('pre', { class: 'code' }, show(d.a)), h('pre', { class: 'code' }, show(d.b)));
  }
  const notes = [];
  if (d.a_present === false) notes.push('The trainer has no chat template.');
  if (d.b_present === false) notes.push('The rollout worker has no chat template.');
  if (d.a_present === false && d.b_present !== false && !rows.length) notes.push('The rollout worker\'s template is empty.');
  if (d.b_present === false && d.a_present !== false && !rows.length) notes.push('The trainer\'s template is empty.');
  const r = d.renders;
  const renderNote = r ? h('p', { class: r.differing && r.differing.length ? 'note' : 'note ok', dataset: { renders: 'true' } },
    r.differing && r.differing.length
      ? `Rendered differently on ${r.differing.length} of ${r.compared} probe conversations (${r.differing.join(', ')}); the same on ${r.same}.`
      : `Rendered the same on all ${r.compared} probe conversations: the templates differ in text only.`,
    r.unexercised && r.unexercised.length ? ` Templates no probe renders: ${r.unexercised.join(', ')}.` : '') : null;
  const named = rows.some((row) => row.kind === 'file' && /chat_template\//.test(`${row.a} ${row.b}`));
  return h('div', {},
    notes.map((n) => h('p', { class: 'note' }, n)),
    renderNote,
    rendered ? h('div', { class: 'rendered-probe' }, h('p', { class: 'muted small' },
      'As rendered (first differing probe conversation; text escaped, first difference marked):'), rendered) : null,
    rows.length ? h('div', { class: 'table-wrap' }, h('table', { class: 'sbs-table', 'aria-label': 'chat template diff' },
      h('colgroup', {}, h('col', { class: 'ln' }), h('col', {}), h('col', { class: 'ln' }), h('col', {})),
      h('thead', {}, h('tr', {}, h('th', { colspan: 2 }, 'trainer'), h('th', { colspan: 2 }, 'rollout'))),
      h('tbody', {}, rows.filter((row) => row.kind !== 'file' || named).map(sbsRow)))) : null);
}

function fileLabel(path) {
  if (!path || path === '/dev/null') return '(absent)';
  const name = path.replace(/^[ab]\//, '');
  const slash = name.indexOf('/');
  if (slash < 0) return name;
  try { return `template “${decodeURIComponent(name.slice(slash + 1))}”`; } catch { return name; }
}

function sbsRow(r) {
  if (r.kind === 'file') {
    return h('tr', { class: 'file' }, h('td', { colspan: 2 }, fileLabel(r.a)), h('td', { colspan: 2 }, fileLabel(r.b)));
  }
  if (r.kind === 'hunk') return h('tr', { class: 'hunk' }, h('td', { colspan: 4 }, r.a));
  const [a, b] = r.kind === 'change' && r.a !== null && r.b !== null ? highlightPair(r.a, r.b) : [[r.a ?? ''], [r.b ?? '']];
  const cls = (value, base) => ['code', r.kind === 'same' ? '' : value === null ? 'blank' : base];
  return h('tr', { class: r.kind === 'same' ? 'same' : 'change' },
    h('td', { class: 'ln' }, r.aLine ?? ''),
    h('td', { class: cls(r.a, 'del'), dataset: { side: 'trainer' } }, visible(a), r.aNoEol ? noEol() : null),
    h('td', { class: 'ln' }, r.bLine ?? ''),
    h('td', { class: cls(r.b, 'add'), dataset: { side: 'rollout' } }, visible(b), r.bNoEol ? noEol() : null));
}

function noEol() {
  return h('span', { class: 'no-eol', title: 'No newline at end of file' }, 'no newline at end');
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

const SHOWN = { '\r': '␍', '\t': '⇥' };

/** Text pieces (strings or <mark> nodes) with CR and tabs made visible; strings stay text nodes. */
function visible(pieces) {
  const out = [];
  for (const piece of [pieces].flat(Infinity)) {
    if (typeof piece !== 'string') {
      if (piece && piece.nodeType === 1 && piece.tagName === 'MARK') {
        const text = piece.textContent;
        piece.replaceChildren(...visible([text]));
      }
      out.push(piece);
      continue;
    }
    let start = 0;
    for (let i = 0; i < piece.length; i++) {
      const sym = SHOWN[piece[i]];
      if (!sym) continue;
      if (i > start) out.push(piece.slice(start, i));
      out.push(h('span', { class: 'ws', title: piece[i] === '\r' ? 'carriage return' : 'tab' }, sym));
      start = i + 1;
    }
    if (start < piece.length) out.push(piece.slice(start));
  }
  return out;
}

// ------------------------------------------------------------------ behaviour probes

const ESCAPES = { '\n': '\\n', '\t': '\\t', '\r': '\\r', '"': '\\"', '\\': '\\\\' };

/** A string as a JSON-style literal, so newlines, tabs and spaces are visible ("\n\n" → "\\n\\n"). */
export function escaped(text) {
  return `"${String(text).replace(/[\n\t\r"\\]|[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g,
    (ch) => ESCAPES[ch] ?? `\\u${ch.charCodeAt(0).toString(16).padStart(4, '0')}`)}"`;
}

function behaviorDetail(d) {
  const sample = d.sample || [];
  const shown = new Set(sample.map((r) => `${r.part} ${r.probe}`));
  const rest = Object.entries(d.differing_probes || {}).flatMap(([part, labels]) =>
    labels.map((l) => `${part} ${l}`)).filter((l) => !shown.has(l));
  return h('div', {},
    d.compared ? h('p', { class: 'muted small' }, `${d.differing} of ${d.compared} probes differ. Text escaped; the first difference is marked.`) : null,
    probeTable(sample),
    rest.length ? h('p', { class: 'muted small' }, `Also differ: ${rest.join(', ')}`) : null);
}

function probeTable(rows) {
  return h('div', { class: 'table-wrap' }, h('table', { class: 'table compact probe-table', 'aria-label': 'behaviour probes' },
    h('colgroup', {}, h('col', { class: 'probe-col' }), h('col', {}), h('col', {})),
    h('thead', {}, h('tr', {}, h('th', {}, 'probe'), h('th', {}, 'trainer'), h('th', {}, 'rollout'))),
    h('tbody', {}, rows.map(probeRow))));
}

/** The probe row of a diff most worth looking at: the first rendered conversation (text on both sides),
 *  else any row with text, else one with tokens (a text encoded differently); null when the behaviour
 *  probes do not differ. */
export function firstRenderedProbe(diff) {
  const behavior = ((diff && diff.components) || []).find((c) => c.name === 'behavior');
  const sample = (behavior && behavior.detail && behavior.detail.sample) || [];
  const texts = (r) => r.text && typeof r.text.a === 'string' && typeof r.text.b === 'string';
  return sample.find((r) => r.part === 'chat' && texts(r)) || sample.find(texts) || sample.find((r) => r.tokens) || null;
}

/** The first rendered probe of a diff as a one-row probe table (both sides, tokens at the first differing id). */
export function renderedProbe(diff) {
  const row = firstRenderedProbe(diff);
  return row ? probeTable([row]) : null;
}

function probeRow(r) {
  const label = typeof r.probe === 'string' ? r.probe : show(r.probe);
  const t = r.tokens;
  return h('tr', { dataset: { part: r.part, probe: label } },
    h('th', { scope: 'row', class: 'probe-name' },
      h('span', { class: 'probe-part' }, r.part), ' ', h('code', {}, label),
      t ? h('div', { class: 'muted small token-at' }, `token ${t.at}`,
        t.span !== null && t.span !== undefined ? [': ', h('code', {}, escaped(t.span)), ' →'] : '') : null),
    probeSide(r, 'a', 'trainer'), probeSide(r, 'b', 'rollout'));
}

function probeSide(r, side, who) {
  const parts = [];
  const error = r.error && r.error[side];
  if (error) parts.push(h('div', { class: 'probe-error' }, 'raised ', h('code', {}, error)));
  const text = r.text ? r.text[side] : undefined;
  if (typeof text === 'string') parts.push(markedText(text, r.text[side === 'a' ? 'b' : 'a']));
  if (r.tokens) parts.push(tokenStrip(r.tokens, side));
  if (!parts.length) parts.push(h('code', { class: 'probe-raw' }, show(r[side])));
  return h('td', { class: ['probe-side', side === 'a' ? 'del' : 'add'], dataset: { side: who } }, parts);
}

/** The escaped text with its first difference from the other side marked (∅: the other side has text here). */
function markedText(text, other) {
  if (typeof other !== 'string' || other === text) return h('pre', { class: 'probe-text' }, escaped(text));
  const [start, end] = firstChange(text, other);
  const lit = (x) => escaped(x).slice(1, -1);
  const changed = text.slice(start, end);
  return h('pre', { class: 'probe-text' }, '"', lit(text.slice(0, start)),
    h('mark', { title: changed ? 'differs from here' : 'the other side has text here' }, changed ? lit(changed) : '∅'),
    lit(text.slice(end)), '"');
}

const SYNC = 8; // characters that must agree again for a change to end
const LOOKAHEAD = 400;

/** [start, end) of the first changed run of `text` against `other`: from the first differing character
 *  to where the two agree again for SYNC characters (shortest edit within LOOKAHEAD). */
export function firstChange(text, other) {
  let p = 0;
  while (p < text.length && p < other.length && text[p] === other[p]) p++;
  const agree = (i, j) => text.slice(p + i, p + i + SYNC) === other.slice(p + j, p + j + SYNC)
    && (text.length - p - i >= SYNC || text.length - p - i === other.length - p - j);
  for (let cost = 0; cost <= 2 * LOOKAHEAD; cost++) {
    for (let i = Math.max(0, cost - LOOKAHEAD); i <= Math.min(cost, LOOKAHEAD); i++) {
      if (agree(i, cost - i)) return [p, Math.min(text.length, p + i)];
    }
  }
  return [p, text.length];
}

function tokenStrip(tokens, side) {
  const mine = tokens[side] || [];
  return h('div', { class: 'token-strip' },
    (tokens.before || []).map((t) => h('code', { class: 'tok' }, escaped(t))),
    mine.length ? mine.map((t) => h('code', { class: 'tok differs' }, escaped(t))) : h('span', { class: 'tok differs ended' }, 'ends here'));
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

/** Sampling parameters: each differing key, both values (null = disabled), and why it matters. */
function samplingDetail(rows) {
  const value = (v) => (v === null || v === undefined ? 'off' : show(v));
  return h('div', { class: 'table-wrap' }, h('table', { class: 'table compact', 'aria-label': 'sampling parameters' },
    h('thead', {}, h('tr', {}, h('th', {}, 'parameter'), h('th', {}, 'trainer'), h('th', {}, 'rollout'),
      h('th', {}, 'why it matters'))),
    h('tbody', {}, rows.map((r) => h('tr', { dataset: { key: r.key } },
      h('td', {}, h('span', { class: `badge badge-${r.severity}` }, r.severity), ' ', h('code', {}, r.key)),
      h('td', { class: 'code del' }, value(r.a)), h('td', { class: 'code add' }, value(r.b)),
      h('td', {}, r.why || ''))))));
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
