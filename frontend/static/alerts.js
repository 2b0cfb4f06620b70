// Alerts timeline: severity, status, acknowledge / resolve, the diff attached to a mismatch alert, the audit trail.
import { api, isAdmin } from './api.js';
import { ago, badge, clear, fmt, h, when } from './dom.js';
import { openDiff } from './diff.js';

let showResolved = false;

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
  history.addEventListener('toggle', async () => {
    if (!history.open || events.childNodes.length) return;
    try {
      const { events: list } = await api(`/alerts/${alert.id}/events`);
      clear(events, list.map((ev) => h('li', { title: when(ev.at) }, h('strong', {}, ev.action), ` by ${ev.actor || 'system'} · ${ago(ev.at)}`,
        ev.note ? [' · ', h('span', { class: 'reason' }, `“${ev.note}”`)] : '')));
    } catch (err) { clear(events, h('li', { class: 'form-error' }, err.message)); }
  });
  const diff = alert.kind === 'processor_mismatch' ? alert.detail?.diff : null;
  const components = alert.detail?.components || [];
  return h('li', { class: `alert-item sev-${alert.severity} status-${alert.status}`, dataset: { alertId: alert.id, kind: alert.kind } },
    h('span', { class: 'dot', 'aria-hidden': 'true' }),
    h('div', { class: 'alert-main' },
      h('div', { class: 'alert-title' }, badge(alert.severity, alert.severity), h('strong', {}, alert.title || alert.kind),
        h('span', { class: `status status-${alert.status}` }, alert.status)),
      h('div', { class: 'muted small' }, `${alert.kind.replace(/_/g, ' ')} · fired ${ago(alert.fired_at)}`,
        alert.step !== null && alert.step !== undefined ? ` at step ${fmt(alert.step)}` : '',
        components.length ? ` · ${components.join(', ')}` : '',
        alert.kind === 'metric_threshold' && alert.detail ? ` · ${alert.detail.key} ${alert.detail.aggregate || ''} = ${alert.detail.value} ${alert.detail.comparison} ${alert.detail.threshold}` : ''),
      h('div', { class: 'alert-actions' },
        diff ? h('button', { class: 'button small', on: { click: () => openDiff(alert.title || 'Processor mismatch', diff, components[0]) } }, 'Show diff') : null,
        alert.status === 'firing' ? h('button', { class: 'button small', disabled: !admin, dataset: { action: 'acknowledge' },
          title: admin ? 'Mark as seen; keeps it open' : 'Needs the admin scope', on: { click: act('acknowledge') } }, 'Acknowledge') : null,
        alert.status !== 'resolved' ? h('button', { class: 'button small', disabled: !admin, dataset: { action: 'resolve' },
          title: admin ? 'Close this alert' : 'Needs the admin scope', on: { click: act('resolve') } }, 'Resolve') : null,
        history)));
}
