// Alerts timeline: severity, status, acknowledge / resolve, the diff attached to a mismatch alert, the audit trail.
import { api, isAdmin } from './api.js';
import { ago, badge, clear, fmt, h, when } from './dom.js';
import { diffFocus, findingNames, openDiff } from './diff.js';

let showResolved = false;
// Alerts whose history the user opened: the list re-renders on every alert change (live updates),
// and a history must stay open across those re-renders rather than snap shut under the reader.
const openHistories = new Set();

export function renderAlerts(container, alerts, me, onChanged) {
  const head = h('div', { class: 'section-head' }, h('h2', {}, 'Alerts'));
  if (alerts === null) { clear(container, head, h('p', { class: 'muted' }, 'Alerts are not available from this server yet.')); return; }
  const open = alerts.filter((a) => a.status !== 'resolved');
  const shown = showResolved ? alerts : open;
  const toggle = h('label', { class: 'small muted toggle' },
    h('input', { type: 'checkbox', checked: showResolved, on: { change: (e) => { showResolved = e.target.checked; renderAlerts(container, alerts, me, onChanged); } } }),
    ` show resolved (${alerts.length - open.length})`);
  head.append(toggle);
  clear(container, head, shown.length
    ? h('ol', { class: 'timeline' }, shown.map((a) => item(a, me, onChanged)))
    : h('p', { class: 'muted' }, open.length === alerts.length ? 'No alerts. All quiet.' : 'No open alerts.'));
}

/** Why a sample_audit alert matters and what to do, with a way to the samples it is about. */
function auditReason(detail) {
  const show = () => document.getElementById('audit')?.scrollIntoView({ behavior: 'smooth', block: 'start' });
  return h('div', { class: 'small alert-why' },
    detail.why ? h('p', {}, h('strong', {}, 'Why: '), detail.why) : null,
    detail.action ? h('p', {}, h('strong', {}, 'What to do: '), detail.action, ' ',
      h('button', { class: 'link-button', dataset: { action: 'show-audit' }, on: { click: show } }, 'Show samples')) : null);
}

function item(alert, me, onChanged) {
  const admin = isAdmin(me);
  const act = (action) => async (e) => {
    e.target.disabled = true;
    try {
      await api(`/alerts/${alert.id}/${action}`, { method: 'POST', body: {} });
      onChanged();
    } catch (err) {
      e.target.disabled = false;
      e.target.title = err.message;
      e.target.textContent = err.status === 403 ? 'needs admin' : 'failed — retry';
    }
  };
  const events = h('ul', { class: 'events' });
  const history = h('details', { class: 'history' }, h('summary', {}, 'History'), events);
  let loading = null;
  const loadHistory = () => (loading ||= (async () => {
    try {
      const { events: list } = await api(`/alerts/${alert.id}/events`);
      clear(events, list.map((ev) => h('li', { title: when(ev.at) }, h('strong', {}, ev.action), ` by ${ev.actor || 'system'} · ${ago(ev.at)}`,
        ev.note ? [' · ', h('span', { class: 'reason' }, `“${ev.note}”`)] : '')));
    } catch (err) { clear(events, h('li', { class: 'form-error' }, err.message)); }
  })());
  history.addEventListener('toggle', () => {
    if (!history.open) { openHistories.delete(alert.id); return; }
    openHistories.add(alert.id);
    loadHistory();
  });
  if (openHistories.has(alert.id)) { history.open = true; loadHistory(); }
  const diff = alert.kind === 'processor_mismatch' ? alert.detail?.diff : null;
  const components = findingNames(alert.detail?.components || [], diff); // behaviour probes that only show another's difference left out
  return h('li', { class: ['alert-item', `sev-${alert.severity}`, `status-${alert.status}`, alert.silenced ? 'is-silenced' : ''],
    dataset: { alertId: alert.id, kind: alert.kind, silenced: alert.silenced ? '1' : '0' } },
    h('span', { class: 'dot', 'aria-hidden': 'true' }),
    h('div', { class: 'alert-main' },
      h('div', { class: 'alert-title' }, badge(alert.severity, alert.severity), h('strong', {}, alert.title || alert.kind),
        h('span', { class: `status status-${alert.status}` }, alert.status),
        alert.silenced ? h('span', { class: 'badge badge-muted silenced', title: `Notifications muted by silence ${(alert.silenced_by || []).join(', ')}` }, 'silenced') : null),
      h('div', { class: 'muted small' }, `${alert.kind.replace(/_/g, ' ')} · fired ${ago(alert.fired_at)}`,
        alert.step !== null && alert.step !== undefined ? ` at step ${fmt(alert.step)}` : '',
        components.length ? ` · ${components.join(', ')}` : '',
        alert.kind === 'metric_threshold' && alert.detail ? ` · ${alert.detail.key} ${alert.detail.aggregate || ''} = ${alert.detail.value} ${alert.detail.comparison} ${alert.detail.threshold}` : ''),
      alert.kind === 'sample_audit' ? auditReason(alert.detail || {}) : null,
      // a built-in or pack rule says what its level means and where it comes from
      alert.kind !== 'sample_audit' && alert.detail?.rule_id && alert.detail.why
        ? h('div', { class: 'small alert-why' }, h('p', {}, h('strong', {}, 'Why: '), alert.detail.why)) : null,
      h('div', { class: 'alert-actions' },
        diff ? h('button', { class: 'button small', dataset: { action: 'show-diff' }, on: { click: () => openDiff(alert.title || 'Processor mismatch', diff, diffFocus(diff)) } }, 'Show diff') : null,
        alert.status === 'firing' ? h('button', { class: 'button small', disabled: !admin, dataset: { action: 'acknowledge' },
          title: admin ? 'Mark as seen; keeps it open' : 'Needs the admin scope', on: { click: act('acknowledge') } }, 'Acknowledge') : null,
        alert.status !== 'resolved' ? h('button', { class: 'button small', disabled: !admin, dataset: { action: 'resolve' },
          title: admin ? 'Close this alert' : 'Needs the admin scope', on: { click: act('resolve') } }, 'Resolve') : null,
        history)));
}
