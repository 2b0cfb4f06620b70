// Silences on the run page: what mutes this run's notifications now, and a form to mute the run,
// its project or an alert kind for a while (who and why are kept). Muted alerts still show, marked.
import { api, isAdmin, qs, UI_CONFIG } from './api.js';
import { ago, clear, h, modal, when } from './dom.js';

const KINDS = UI_CONFIG.alert_kinds;
const DURATIONS = [['15 minutes', 900], ['1 hour', 3600], ['4 hours', 14400], ['1 day', 86400], ['1 week', 604800]];

export function scopeText(s) {
  const parts = [];
  if (s.run_id !== null && s.run_id !== undefined) parts.push(`run ${s.run_id}`);
  if (s.project) parts.push(`project ${s.project}`);
  if (s.kind) parts.push(`${s.kind.replace(/_/g, ' ')} alerts`);
  return parts.join(' · ');
}

/** The active silences that apply to `run`, with Expire buttons, and the "Silence…" button. */
export async function renderSilences(container, run, me, onChange) {
  const admin = isAdmin(me);
  let list;
  try {
    list = (await api(`/silences${qs({ run_id: run.id, state: 'active' })}`)).silences;
  } catch (err) {
    clear(container, err.status === 404 ? null : h('p', { class: 'muted small' }, `Silences: ${err.message}`));
    return;
  }
  const add = h('button', { class: 'button small', dataset: { action: 'silence' }, disabled: !admin,
    title: admin ? 'Mute notifications for a while' : 'Needs the admin scope',
    on: { click: async () => { if (await silenceDialog(run)) onChange(); } } }, 'Silence…');
  clear(container,
    list.length ? h('ul', { class: 'silence-list' }, list.map((s) => item(s, admin, onChange))) : null,
    h('div', { class: 'silence-actions' }, list.length ? null : h('span', { class: 'muted small' }, 'Notifications are on.'), add));
}

function item(silence, admin, onChange) {
  const expire = h('button', { class: 'link-button', disabled: !admin, dataset: { action: 'expire' }, on: { click: async () => {
    expire.disabled = true;
    try { await api(`/silences/${silence.id}/expire`, { method: 'POST', body: {} }); onChange(); } catch (err) {
      expire.disabled = false;
      expire.textContent = err.message;
    }
  } } }, 'Expire now');
  return h('li', { class: 'silence', dataset: { silenceId: silence.id } },
    h('strong', {}, 'Silenced: '), scopeText(silence),
    h('span', { class: 'muted', title: when(silence.ends_at) }, ` until ${new Date(silence.ends_at).toLocaleString()}`),
    ` · by ${silence.created_by} ${ago(silence.created_at)}: `, h('span', { class: 'reason' }, `“${silence.reason}”`), ' ', expire);
}

/** Ask what to mute, for how long and why; resolves to the new silence, or null if cancelled. */
export function silenceDialog(run) {
  return new Promise((resolve) => {
    let result = null;
    const scope = h('select', { name: 'scope', id: 'silence-scope' },
      h('option', { value: 'run' }, `this run (${run.name})`),
      h('option', { value: 'project' }, `every run of project ${run.project}`));
    const kind = h('select', { name: 'kind', id: 'silence-kind' },
      h('option', { value: '' }, 'every alert kind'), KINDS.map((k) => h('option', { value: k }, k.replace(/_/g, ' '))));
    const duration = h('select', { name: 'duration', id: 'silence-duration' },
      DURATIONS.map(([label, s], i) => h('option', { value: s, selected: i === 1 }, label)));
    const reason = h('textarea', { id: 'silence-reason', name: 'reason', rows: 3, required: true, maxlength: 2000,
      placeholder: 'Why? (kept with the silence)' });
    const error = h('p', { class: 'form-error', role: 'alert' });
    const submit = h('button', { class: 'button primary', type: 'submit' }, 'Silence');
    const form = h('form', { class: 'silence-form' },
      h('p', { class: 'muted small' }, 'Alerts keep firing and show here, marked; no notification about them (webhooks, Slack), firing or resolved, '
        + 'goes out until the silence ends. Then what still fires is notified, and what was announced and resolved meanwhile is notified as resolved.'),
      h('label', { for: 'silence-scope' }, 'Mute'), scope,
      h('label', { for: 'silence-kind' }, 'Alerts'), kind,
      h('label', { for: 'silence-duration' }, 'For'), duration,
      h('label', { for: 'silence-reason' }, 'Reason'), reason, error,
      h('div', { class: 'actions' }, h('button', { class: 'button', type: 'button', on: { click: () => dialog.close() } }, 'Cancel'), submit));
    const dialog = modal('Silence notifications', form, { onClose: () => resolve(result) });
    reason.focus();
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      if (!reason.value.trim()) { error.textContent = 'A reason is required.'; return; }
      const body = { duration_s: Number(duration.value), reason: reason.value.trim() };
      if (scope.value === 'run') body.run_id = run.id; else body.project = run.project;
      if (kind.value) body.kind = kind.value;
      submit.disabled = true;
      try {
        result = await api('/silences', { method: 'POST', body });
        dialog.close();
      } catch (err) {
        submit.disabled = false;
        error.textContent = err.status === 403 ? 'Your token lacks the admin scope.' : err.message;
      }
    });
  });
}
