// Parity panel: trainer vs each group of rollout workers (same fingerprint = one group), component by component.
import { UI_CONFIG } from './api.js';
import { ago, ageSeconds, clear, h } from './dom.js';
import { diffFocus, evidenceText, findings, firstRenderedProbe, openDiff, renderedProbe } from './diff.js';

const STALE_S = 60;
const VERDICT_TEXT = { same: 'same as trainer', info: 'differs (info only)', warning: 'differs (warning)', error: 'differs', unknown: 'not comparable' };
// Fingerprint component order (docs/design.md, "Fingerprints and verdicts"; the chat template first: the most
// readable cause); unknown names are appended.
const ORDER = UI_CONFIG.fingerprint_component_order;

export function groupLabel(group) {
  const n = group.components.length;
  const who = n === 1 ? `1 worker (${group.components[0].worker_id})` : `${n} workers`;
  return `${who} — ${VERDICT_TEXT[group.verdict] || group.verdict}`;
}

function componentNames(parity) {
  const names = new Set();
  for (const g of parity.groups) {
    for (const n of g.components_compared || []) names.add(n);
    for (const c of g.diff?.components || []) names.add(c.name);
  }
  if (!names.size) ORDER.forEach((n) => names.add(n));
  return [...names].sort((a, b) => (ORDER.indexOf(a) + 1 || 99) - (ORDER.indexOf(b) + 1 || 99) || a.localeCompare(b));
}

/** `stateOf(componentId)`: the state the run shows the process in (live, closed, ended, lost). */
export function renderParity(container, parity, stateOf = () => 'live') {
  const head = h('div', { class: 'section-head' }, h('h2', {}, 'Processor parity'));
  if (!parity) { clear(container, head, h('p', { class: 'muted' }, 'Parity is not available from this server yet.')); return; }
  const { trainer, groups = [], missing_fingerprint: missing = [] } = parity;
  if (!trainer && !groups.length) {
    clear(container, head, h('p', { class: 'muted' }, 'No fingerprints yet: components send one when they register their processor.'));
    return;
  }
  const names = componentNames(parity);
  const table = h('table', { class: 'table parity-table' },
    h('thead', {}, h('tr', {}, h('th', { scope: 'col' }, 'component'),
      groups.map((g, i) => h('th', { scope: 'col', class: `group-head verdict-${g.verdict}`, dataset: { group: i } }, groupLabel(g),
        g.diff?.components?.length ? [' ', h('button', { class: 'link-button small', dataset: { action: 'show-diff' },
          on: { click: () => openDiff(groupLabel(g), g.diff, diffFocus(g.diff)) } }, 'show diff')] : null)))),
    h('tbody', {}, names.map((name) => h('tr', { dataset: { component: name } },
      h('th', { scope: 'row' }, h('code', {}, name)),
      groups.map((g, i) => cell(g, i, name))))));
  clear(container, head,
    h('p', { class: 'muted small' }, trainer
      ? ['Trainer ', h('code', {}, trainer.worker_id), ` · fingerprint ${String(trainer.digest || '').slice(0, 12)}…`]
      : 'No trainer fingerprint yet: rollout workers cannot be compared.'),
    groups.length ? h('div', { class: 'table-wrap' }, table) : h('p', { class: 'muted' }, 'No rollout worker has sent a fingerprint yet.'),
    probePreviews(groups),
    groups.map((g) => workerList(g, stateOf)),
    missing.length ? h('p', { class: 'note' }, `${missing.length} component(s) have not sent a fingerprint: `,
      missing.map((m) => `${m.side} ${m.worker_id}`).join(', ')) : null);
}

function cell(group, index, name) {
  if (group.verdict === 'unknown') return h('td', { class: 'cell-unknown' }, '—');
  const row = (group.diff?.components || []).find((c) => c.name === name);
  if (!row) return h('td', { class: 'cell-same', dataset: { state: 'same' } }, '✓ same');
  const { components, evidence } = findings(group.diff);
  const open = (focus) => () => openDiff(`${groupLabel(group)}: ${focus}`, group.diff, focus);
  if (!components.includes(row)) { // behaviour probes that demonstrate another component's difference
    const by = Object.keys(evidence);
    return h('td', { class: 'cell-evidence', dataset: { state: 'evidence' }, title: 'Not a difference of its own: the probes that show it' },
      '↳ evidence of ', by.map((n, i) => [i ? ', ' : '', h('button', { class: 'link-button', on: { click: open(n) } }, n)]));
  }
  return h('td', { class: `cell-differs sev-${row.severity}`, dataset: { state: 'differs', severity: row.severity } },
    h('button', { class: 'link-button', title: row.summary || '', on: { click: open(name) } }, `✗ differs · ${row.severity}`),
    (evidence[name] || []).map((item) => h('span', { class: 'evidence-cell', dataset: { evidence: item.part } }, evidenceText(item, row))));
}

const VERB = { chat: 'renders', encode: 'encodes', encode_no_special: 'encodes', decode: 'decodes' };
// The same text with other ids: a vocabulary or special-token difference, not a template one.
const verb = (row) => (row.tokens && row.text && row.text.a === row.text.b ? 'tokenizes' : VERB[row.part] || 'handles');

/** For each differing group, what its workers render differently from the trainer: the first differing
 *  probe conversation on both sides and the tokens at the first differing id (the first group open). */
function probePreviews(groups) {
  let first = true;
  return groups.map((g, i) => {
    const row = g.verdict === 'same' ? null : firstRenderedProbe(g.diff);
    if (!row) return null;
    const open = first;
    first = false;
    return h('details', { class: 'probe-preview', open, dataset: { group: i } },
      h('summary', {}, `${groupLabel(g)}: ${verb(row)} `, h('code', {}, String(row.probe)), ' differently'),
      renderedProbe(g.diff));
  });
}

function workerList(group, stateOf) {
  const comps = group.components;
  // Only a live process can be stale: one that closed or ended (its run is over) is silent by design.
  const isStale = (c) => stateOf(c.component_id) === 'live' && ageSeconds(c.last_heartbeat) > STALE_S;
  const stale = comps.filter(isStale).length;
  return h('details', { class: `workers verdict-${group.verdict}` },
    h('summary', {}, `${groupLabel(group)}`, stale ? h('span', { class: 'badge badge-warning' }, `${stale} stale`) : null),
    h('ul', { class: 'worker-list' }, comps.map((c) => {
      const shown = stateOf(c.component_id);
      return h('li', {}, h('code', {}, c.worker_id), c.host ? ` on ${c.host}` : '', shown === 'live' ? '' : ` · ${shown}`, ' · heartbeat ',
        h('span', { class: isStale(c) ? 'stale' : 'fresh' }, ago(c.last_heartbeat)));
    })));
}

/** The differing rollout groups with an error verdict (for the red banner). */
export function mismatchGroups(parity) {
  return (parity?.groups || []).filter((g) => g.verdict === 'error');
}
