// Sample audit: the worst samples of the run's latest rollout batches, with the tokens around each first
// mismatch. Token strings are whatever the tokenizer decoded (`<script>`, bidi marks, newlines): they reach
// the page only as text nodes (h()), in the server's escaped form (`*_shown`), never as HTML.
import { api } from './api.js';
import { ago, clear, fmt, h } from './dom.js';

const BATCHES = 5;
const FINISH_TEXT = { eos: 'ended on eos', length: 'cut at length limit', stop: 'other stop', unknown: 'finish unknown' };
const KIND_TEXT = {
  rerender: 'trainer re-render differs from the prompt the rollout sampled from',
  length: 'ids and log-probs stop pairing up here',
  ids: 'the ids the trainer trains on leave the sampled ones here',
  eos: 'the rollout sampled on past this eos',
};
// A batch's failure counts (the hooks' names) and how the badge reads; truncated: the engine's own cuts.
const FAILURES = [
  ['length_mismatch', 'length mismatch', 'error'],
  ['rerender_mismatch', 're-render mismatch', 'error'],
  ['ids_mismatch', 'trained ids ≠ sampled', 'error'],
  ['eos_ignored', 'sampled past eos', 'error'],
  ['images_mismatch', 'image features differ', 'error'],
  ['truncated', 'cut by the trainer', 'warning'],
  ['finish_lost', 'finish reason lost', 'warning'],
];

let failingOnly = false;

export async function renderAudit(container, runId) {
  const toggle = h('label', { class: 'small muted toggle' },
    h('input', { type: 'checkbox', checked: failingOnly, dataset: { action: 'failing-only' },
      on: { change: (e) => { failingOnly = e.target.checked; renderAudit(container, runId).catch(() => {}); } } }),
    ' only batches with a mismatch');
  const head = h('div', { class: 'section-head' }, h('h2', {}, 'Sample audit'),
    h('span', { class: 'muted small' }, `worst samples of the latest ${BATCHES} audited batches`), toggle);
  let page;
  try {
    page = await api(`/runs/${runId}/audits?limit=${BATCHES}${failingOnly ? '&failing=true' : ''}`);
  } catch (err) {
    if (err.status === 404 || err.status === 405) { clear(container, head, h('p', { class: 'muted' }, 'This server has no sample audit.')); return; }
    clear(container, head, h('p', { class: 'form-error', role: 'alert' }, `Could not load the sample audit: ${err.message}`));
    return;
  }
  if (!page.audits.length && failingOnly) {
    clear(container, head, h('p', { class: 'muted' }, 'No audited batch has a failing sample.'));
    return;
  }
  if (!page.audits.length) {
    clear(container, head, h('p', { class: 'muted' }, 'No audited batches yet: ',
      h('code', {}, 'monitor.log_rollout_batch(records, processor, trainer_logprobs)'), ' audits each rollout batch.'));
    return;
  }
  clear(container, head, page.audits.map(batchBlock));
}

function batchBlock(audit) {
  const c = audit.counts || {};
  const failing = FAILURES.some(([name]) => (c[name] || 0) > 0);
  return h('div', { class: ['audit-batch', failing ? 'audit-failing' : null], dataset: { audit: audit.id, step: audit.step ?? '' } },
    h('div', { class: 'audit-batch-head' },
      h('strong', {}, audit.step === null ? `batch ${audit.id}` : `step ${fmt(audit.step)}`),
      audit.worker_id ? [' · ', h('code', {}, audit.worker_id)] : null,
      h('span', { class: 'muted small' }, ` · ${fmt(c.samples)} samples · ${ago(audit.received_at)} `),
      FAILURES.map(([name, what, kind]) => countBadge(c[name], what, kind)),
      countBadge(c.finish_length, 'truncated', 'warning'),
      failing || c.finish_length ? null : h('span', { class: 'badge badge-ok' }, 'clean')),
    audit.samples.length ? h('div', { class: 'table-wrap' }, sampleTable(audit.samples)) : null);
}

function countBadge(n, what, kind) {
  return n ? h('span', { class: `badge badge-${kind}` }, `${fmt(n)} ${what}`) : null;
}

function sampleTable(samples) {
  return h('table', { class: 'table compact audit-table' },
    h('thead', {}, h('tr', {}, ['sample', 'finish', 'ids / log-probs', 'first mismatch'].map((t) => h('th', { scope: 'col' }, t)))),
    h('tbody', {}, samples.map((s) => h('tr', { dataset: { sample: s.index, rank: s.rank } },
      h('td', {}, `#${s.index}`),
      h('td', {}, h('span', { class: `finish finish-${s.finish}`, title: s.finish_reason ? `engine said: ${s.finish_reason}` : '' },
        FINISH_TEXT[s.finish] || s.finish)),
      h('td', { class: s.length_mismatch || s.ids_mismatch ? 'sev-error' : '' }, lengths(s)),
      h('td', {}, findings(s))))));
}

/** What is wrong with a sample besides its token windows: a cut, a lost finish reason, image features. */
function findings(s) {
  const notes = [];
  if (s.truncated) notes.push(h('div', { class: 'sev-warning', dataset: { finding: 'truncated' } },
    `the trainer trains on ${fmt(s.n_trainer_ids)} of ${fmt(s.n_ids)} sampled ids`));
  if (s.finish_lost) notes.push(h('div', { class: 'sev-warning', dataset: { finding: 'finish_lost' } },
    'no finish reason and no eos at the end: cut unseen?'));
  if (s.ids_mismatch && s.ids_first_diff === null) notes.push(h('div', { class: 'sev-error', dataset: { finding: 'ids' } },
    'the ids were rewritten after sampling (their digest differs)'));
  if (s.images_mismatch) notes.push(h('div', { class: 'sev-error', dataset: { finding: 'images' } },
    `images: rollout ${images(s.rollout_images)}; trainer ${images(s.trainer_images)}`));
  const windows = s.windows.map(tokenWindow);
  return notes.length || windows.length ? [notes, windows] : h('span', { class: 'muted' }, '—');
}

function images(summary) {
  if (!summary || !summary.images) return 'no image features';
  const grids = summary.grid.slice(0, 4).map((row) => row.join('×')).join(', ');
  return `${summary.images} image${summary.images === 1 ? '' : 's'} ${grids}` +
    (summary.image_tokens === null ? '' : `, ${fmt(summary.image_tokens)} image tokens`);
}

function lengths(s) {
  const parts = [`${fmt(s.n_ids)} ids`];
  if (s.n_rollout_logprobs !== null) parts.push(`${fmt(s.n_rollout_logprobs)} rollout`);
  if (s.n_trainer_logprobs !== null) parts.push(`${fmt(s.n_trainer_logprobs)} trainer`);
  if (s.n_trainer_ids !== null && s.n_trainer_ids !== undefined) parts.push(`${fmt(s.n_trainer_ids)} trained ids`);
  return `${parts.join(' · ')}${s.length_mismatch || s.ids_mismatch ? ' ✗' : ''}`;
}

/** One window: a row of tokens per side, the first mismatch marked (a <mark>, and aria text for readers). */
function tokenWindow(w) {
  const rows = [tokenRow(w.kind === 'length' || w.kind === 'eos' ? 'completion' : 'rollout', w.rollout_shown, w)];
  if (w.trainer_shown) rows.push(tokenRow('trainer', w.trainer_shown, w));
  return h('div', { class: 'token-window', dataset: { kind: w.kind, at: w.at } },
    h('div', { class: 'muted small' }, `${KIND_TEXT[w.kind] || w.kind}: token ${fmt(w.at)}`), rows);
}

function tokenRow(label, tokens, w) {
  return h('div', { class: 'token-row', dataset: { side: label } },
    h('span', { class: 'token-side' }, label),
    w.start > 0 ? h('span', { class: 'muted' }, '… ') : null,
    tokens.map((text, i) => (w.start + i === w.at
      ? h('mark', { class: 'tok tok-mismatch', title: `first mismatch, token ${w.at}`, dataset: { mismatch: 'true' } }, text)
      : h('span', { class: 'tok' }, text))),
    w.at >= w.start + tokens.length ? h('mark', { class: 'tok tok-mismatch tok-missing', title: 'nothing here on this side', dataset: { mismatch: 'true' } }, '∅') : null);
}
