// Settings: per-run rules and mismatch policy; webhooks (add, send test, delivery log).
import { api, isAdmin, UI_CONFIG, whoami } from './api.js';
import { ago, badge, clear, errorState, h, when } from './dom.js';

const field = (label, input) => h('label', { class: 'field' }, h('span', {}, label), input);
const select = (name, options, value) => h('select', { name }, options.map((o) => h('option', { value: o, selected: o === value }, o)));

// ------------------------------------------------------------------ per-run: mismatch policy + rules

export function renderRunSettings(container, runId, me, onRules) {  // returns a function that reloads the rules
  const admin = isAdmin(me);
  const policy = h('div', { class: 'policy' });
  const rules = h('div', { class: 'rules' });
  clear(container, h('div', { class: 'section-head' }, h('h2', {}, 'Rules and settings')), policy, rules);
  loadPolicy();
  loadRules();
  return loadRules;

  async function loadPolicy() {
    let current;
    try {
      current = await api(`/runs/${runId}/settings`);
    } catch (err) {
      clear(policy, h('p', { class: 'muted' }, err.status === 404 ? 'Mismatch policy: not available from this server yet.' : err.message));
      return;
    }
    const choice = select('on_mismatch', ['pause', 'alert', 'ignore'], current.on_mismatch);
    const note = h('span', { class: 'muted small', 'aria-live': 'polite' });
    choice.disabled = !admin;
    choice.addEventListener('change', async () => {
      try {
        // only this field: the run's packs may have changed since (the suggestion banner enables them)
        await api(`/runs/${runId}/settings`, { method: 'PUT', body: { on_mismatch: choice.value } });
        note.textContent = 'saved';
      } catch (err) { note.textContent = err.message; choice.value = current.on_mismatch; }
    });
    clear(policy, h('div', { class: 'inline-field' }, h('span', {}, 'On a processor mismatch:'), choice, note));
  }

  async function loadRules() {
    let list;
    try {
      list = (await api(`/runs/${runId}/rules`)).rules;
    } catch (err) {
      clear(rules, h('p', { class: 'muted' }, err.status === 404 ? 'Threshold rules: not available from this server yet.' : err.message));
      return;
    }
    onRules(list);
    clear(rules,
      h('div', { class: 'table-wrap' }, h('table', { class: 'table compact rules-table' },
        h('thead', {}, h('tr', {}, ['metric', 'condition', 'severity', 'action', 'scope', 'enabled', ''].map((t) => h('th', {}, t)))),
        h('tbody', {}, list.length ? list.map(ruleRow) : h('tr', {}, h('td', { colspan: 7, class: 'empty' }, 'No rules.'))))),
      admin ? ruleForm() : h('p', { class: 'muted small' }, 'Editing rules needs the admin scope.'));
  }

  function ruleRow(rule) {
    const enabled = h('input', { type: 'checkbox', checked: rule.enabled, disabled: !admin, 'aria-label': `enable rule ${rule.key}` });
    enabled.addEventListener('change', async () => {
      // Busy until the server has the change: a second click cannot race the first, and the box
      // is only usable again once it shows what the server holds.
      enabled.disabled = true;
      enabled.setAttribute('aria-busy', 'true');
      try {
        await api(`/rules/${rule.id}`, { method: 'PATCH', body: { enabled: enabled.checked } });
        await loadRules();
      } catch (err) {
        enabled.checked = !enabled.checked;
        enabled.title = err.message;
        enabled.disabled = false;
        enabled.removeAttribute('aria-busy');
      }
    });
    const scope = (rule.builtin ? 'built-in' : rule.run_id ? 'this run' : `project ${rule.project}`) + (rule.pack ? ` · ${rule.pack} pack` : '');
    const del = admin && !rule.builtin ? h('button', { class: 'link-button', on: { click: async () => {
      try { await api(`/rules/${rule.id}`, { method: 'DELETE' }); loadRules(); } catch (err) { del.textContent = err.message; }
    } } }, 'delete') : null;
    return h('tr', { dataset: { ruleId: rule.id } },
      h('td', {}, h('code', {}, rule.key)),
      h('td', {}, condition(rule), rule.per_worker ? ' · per worker' : '', rule.consecutive > 1 ? ` × ${rule.consecutive}` : '',
        rule.keep_firing_for ? h('span', { class: 'muted small', title: 'evaluations within the threshold before a firing alert resolves' }, ` · keeps firing ${rule.keep_firing_for}`) : ''),
      h('td', {}, badge(rule.severity, rule.severity)), h('td', {}, rule.action), h('td', { class: 'muted' }, scope), h('td', {}, enabled), h('td', {}, del));
  }

  function condition(rule) {
    if (rule.kind === 'baseline') return `start: median of the first ${rule.window} points ${rule.comparison} ${rule.threshold}`;
    if (rule.kind === 'sawtooth') return `saw-tooth: climbs and falls back twice, each ≥ ${rule.threshold}× noise (blocks of ${rule.window} points)`;
    if (rule.kind !== 'trend') return `${rule.aggregate} over ${rule.window} step(s) ${rule.comparison} ${rule.threshold}`;
    const way = rule.comparison.startsWith('>') ? 'rises' : 'falls';
    return `trend: median ${way} ≥ ${rule.threshold}× noise (blocks of ${rule.window} points)` + (rule.min_change ? ` and by ≥ ${rule.min_change}` : '');
  }

  function ruleForm() {
    const error = h('p', { class: 'form-error', role: 'alert' });
    const form = h('form', { class: 'form-grid' },
      field('Metric key', h('input', { name: 'key', required: true, placeholder: 'align/kl_k3' })),
      field('Kind', h('select', { name: 'kind', title: 'threshold: a level; trend: a step or drift of the median, scored against the noise (threshold = score, e.g. 8; window = points per block); baseline: the median of the first window points against the threshold; sawtooth: climbs that fall back at once, twice (threshold = score, e.g. 8)' },
        ['threshold', 'trend', 'baseline', 'sawtooth'].map((kind) => h('option', { value: kind }, kind)))),
      field('Aggregate', select('aggregate', ['last', 'mean', 'max', 'min'], 'last')),
      field('Window (steps)', h('input', { name: 'window', type: 'number', min: 1, value: 1, required: true })),
      field('Comparison', select('comparison', ['>', '>=', '<', '<='], '>')),
      field('Threshold', h('input', { name: 'threshold', type: 'number', step: 'any', required: true })),
      field('Consecutive (for)', h('input', { name: 'consecutive', type: 'number', min: 1, value: 1, required: true,
        title: 'breaching evaluations in a row before it fires' })),
      field('Keep firing for', h('input', { name: 'keep_firing_for', type: 'number', min: 0, value: 0, required: true,
        title: 'evaluations within the threshold before a firing alert resolves: a metric hovering at the threshold stays one alert' })),
      field('Severity', select('severity', ['error', 'warning', 'info'], 'warning')),
      field('Action', select('action', ['alert', 'pause', 'stop'], 'alert')),
      field('Per worker', h('input', { name: 'per_worker', type: 'checkbox', title: 'also each worker\'s own <worker>/<key> series, with its own alert' })),
      h('div', { class: 'form-actions' }, h('button', { class: 'button primary', type: 'submit' }, 'Add rule')), error);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      const d = Object.fromEntries(new FormData(form));
      const body = { key: d.key.trim(), aggregate: d.aggregate, window: Number(d.window), comparison: d.comparison,
        threshold: Number(d.threshold), consecutive: Number(d.consecutive), keep_firing_for: Number(d.keep_firing_for),
        severity: d.severity, action: d.action, enabled: true, kind: d.kind, per_worker: d.per_worker === 'on' };
      try { await api(`/runs/${runId}/rules`, { method: 'POST', body }); loadRules(); } catch (err) { error.textContent = err.message; }
    });
    return h('details', { class: 'add-rule' }, h('summary', {}, 'Add a rule'), form);
  }
}

// ------------------------------------------------------------------ webhooks page

const GROUP_LABELS = ['run', 'kind', 'project', 'severity'];

/** The event types the server sends (the contract's list, from ui-config): the one list the form offers. */
async function eventTypes() {
  return UI_CONFIG.webhook_events;
}

const seconds = (s) => (s >= 3600 && s % 3600 === 0 ? `${s / 3600} h` : s >= 60 && s % 60 === 0 ? `${s / 60} min` : `${s} s`);

export function groupingText(g) {
  if (!g || !g.group_by) return '';
  return `grouped by ${g.group_by.join(' + ')} · wait ${seconds(g.group_wait_s)} · changes every ${seconds(g.group_interval_s)} · repeat every ${seconds(g.repeat_interval_s)}`;
}

export async function renderWebhooks(root) {
  const [me, events] = await Promise.all([whoami(), eventTypes()]);
  const list = h('div', { class: 'webhooks' });
  const secretSlot = h('div');
  clear(root, h('div', { class: 'page-head' }, h('h1', {}, 'Webhooks'),
    h('p', { class: 'muted small' }, 'Events are POSTed to these URLs, signed per Standard Webhooks (or in Slack format). ',
      'Alert notifications are grouped (by default one message per run and alert kind) and never sent for a clean finish.')),
  secretSlot, list, isAdmin(me) ? addForm() : null);
  await load();

  async function load() {
    let hooks;
    try {
      hooks = (await api('/webhooks')).webhooks;
    } catch (err) {
      clear(list, err.status === 404 ? h('p', { class: 'muted' }, 'Webhooks are not available from this server yet.') : errorState(err, load));
      return;
    }
    clear(list, hooks.length ? hooks.map(hookCard) : h('p', { class: 'muted card' }, 'No webhooks yet.'));
  }

  function addForm() {
    const error = h('p', { class: 'form-error', role: 'alert' });
    // Where to send (the URL gets the room a URL needs), what, and how alert notifications are grouped.
    const form = h('form', { class: 'card webhook-form' },
      h('h2', {}, 'Add a webhook'),
      h('div', { class: 'webhook-target' },
        field('URL', h('input', { name: 'url', type: 'url', required: true, placeholder: 'https://hooks.example.com/paritywatch' })),
        field('Format', select('format', ['standard', 'slack'], 'standard')),
        field('Project (empty = all)', h('input', { name: 'project', placeholder: 'every project' }))),
      h('fieldset', { class: 'webhook-set events' }, h('legend', {}, 'Events (none = all)'),
        h('div', { class: 'checks' }, events.map((ev) => h('label', { class: 'check', title: ev.description },
          h('input', { type: 'checkbox', name: 'events', value: ev.type }), ev.type)))),
      h('fieldset', { class: 'webhook-set grouping' }, h('legend', {}, 'Grouping of alert notifications (empty = server default)'),
        h('div', { class: 'checks' }, h('span', { class: 'muted small' }, 'Group by'),
          GROUP_LABELS.map((g) => h('label', { class: 'check' }, h('input', { type: 'checkbox', name: 'group_by', value: g }), g))),
        h('div', { class: 'webhook-intervals' },
          field('Group wait (s)', h('input', { name: 'group_wait_s', type: 'number', min: 0, step: 'any', placeholder: 'default' })),
          field('Group interval (s)', h('input', { name: 'group_interval_s', type: 'number', min: 0, step: 'any', placeholder: 'default' })),
          field('Repeat interval (s)', h('input', { name: 'repeat_interval_s', type: 'number', min: 1, step: 'any', placeholder: 'default' })))),
      h('div', { class: 'form-actions' }, h('button', { class: 'button primary', type: 'submit' }, 'Add webhook')), error);
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      const data = new FormData(form);
      const body = { url: data.get('url'), format: data.get('format'), events: data.getAll('events'), project: data.get('project') || null };
      if (data.getAll('group_by').length) body.group_by = data.getAll('group_by');
      for (const name of ['group_wait_s', 'group_interval_s', 'repeat_interval_s']) {
        if (data.get(name) !== '') body[name] = Number(data.get(name));
      }
      try {
        const hook = await api('/webhooks', { method: 'POST', body });
        form.reset();
        error.textContent = '';
        clear(secretSlot, h('div', { class: 'card secret', role: 'status' },
          h('strong', {}, 'Signing secret (shown once, store it now): '), h('code', { class: 'secret-value' }, hook.secret || '(none returned)')));
        load();
      } catch (err) { error.textContent = err.message; }
    });
    return form;
  }

  function hookCard(hook) {
    const deliveries = h('div', { class: 'deliveries' });
    const log = h('details', { class: 'delivery-log' }, h('summary', {}, 'Delivery log'), deliveries);
    const loadDeliveries = async () => {
      try {
        const { deliveries: rows } = await api(`/webhooks/${hook.id}/deliveries`);
        clear(deliveries, rows.length ? deliveryTable(rows) : h('p', { class: 'muted small' }, 'No deliveries yet.'));
      } catch (err) { clear(deliveries, h('p', { class: 'form-error' }, err.message)); }
    };
    log.addEventListener('toggle', () => { if (log.open) loadDeliveries(); });
    const note = h('span', { class: 'muted small', 'aria-live': 'polite' });
    const admin = isAdmin(me);
    const test = h('button', { class: 'button small', disabled: !admin, on: { click: async () => {
      try {
        const r = await api(`/webhooks/${hook.id}/test`, { method: 'POST', body: {} });
        note.textContent = `test event queued (delivery ${r.delivery_id})`;
        log.open = true;
        setTimeout(loadDeliveries, 1500);
      } catch (err) { note.textContent = err.message; }
    } } }, 'Send test');
    const toggle = h('button', { class: 'button small', disabled: !admin, on: { click: async () => {
      try { await api(`/webhooks/${hook.id}`, { method: 'PATCH', body: { enabled: !hook.enabled } }); load(); } catch (err) { note.textContent = err.message; }
    } } }, hook.enabled ? 'Disable' : 'Enable');
    const remove = h('button', { class: 'button small danger', disabled: !admin, on: { click: async () => {
      if (remove.dataset.armed !== '1') { remove.dataset.armed = '1'; remove.textContent = 'Click again to delete'; return; }
      try { await api(`/webhooks/${hook.id}`, { method: 'DELETE' }); load(); } catch (err) { note.textContent = err.message; }
    } } }, 'Delete');
    return h('article', { class: 'card webhook', dataset: { webhookId: hook.id } },
      h('div', { class: 'webhook-head' }, h('code', { class: 'url' }, hook.url), badge(hook.enabled ? 'enabled' : 'disabled', hook.enabled ? 'ok' : 'muted')),
      h('p', { class: 'muted small' }, `${hook.format} format · events: ${hook.events?.length ? hook.events.join(', ') : 'all'} · project: ${hook.project || 'all'} · added ${ago(hook.created_at)}`),
      hook.grouping ? h('p', { class: 'muted small grouping' }, groupingText(hook.grouping)) : null,
      h('div', { class: 'actions' }, test, toggle, remove, note), log);
  }
}

function deliveryTable(rows) {
  return h('div', { class: 'table-wrap' }, h('table', { class: 'table compact' },
    h('thead', {}, h('tr', {}, ['event', 'status', 'attempts', 'last error', 'created', 'delivered'].map((t) => h('th', {}, t)))),
    h('tbody', {}, rows.map((d) => h('tr', { dataset: { status: d.status } },
      h('td', {}, d.event_type), h('td', {}, badge(d.status, d.status === 'delivered' ? 'ok' : d.status === 'failed' ? 'error' : 'muted')),
      h('td', { class: 'num', title: (d.attempt_log || []).map((a) => `${a.at}: ${a.status_code ?? a.error} (${a.duration_ms} ms)`).join('\n') }, d.attempts),
      h('td', { class: 'code' }, d.last_error || ''), h('td', { title: when(d.created_at) }, ago(d.created_at)),
      h('td', { title: when(d.delivered_at) }, d.delivered_at ? ago(d.delivered_at) : '—'))))));
}
