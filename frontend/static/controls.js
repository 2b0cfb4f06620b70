// Run controls: pause / resume / stop with a reason and a confirmation; state and who changed it.
import { UI_CONFIG, api, isAdmin } from './api.js';
import { ago, clear, h, modal, stateBadge, when } from './dom.js';

// How each action is offered; the states it may be taken in are the server's (ui-config, the wire contract).
const ACTIONS = {
  pause: { label: 'Pause', verb: 'Pause', cls: 'warn', help: 'Hooks block at the next step boundary until resumed.' },
  resume: { label: 'Resume', verb: 'Resume', cls: 'primary', help: 'Training continues from where it blocked.' },
  stop: { label: 'Stop', verb: 'Stop', cls: 'danger', help: 'Hooks report should_stop; the run is "stopping" until the training loop ends, then "stopped" (a crashed run stops at once). This cannot be undone.' },
};

/** Whether `action` may be taken on a run in `state` (the server would refuse it otherwise). */
export function actionAllowed(action, state) {
  return UI_CONFIG.control_actions[action].allowed_from.includes(state);
}

// What each state means, shown beside the badge.
const STATE_HELP = {
  running: 'processes may train',
  paused: 'hooks block at the next step boundary',
  stopping: 'waiting for the training loop to end',
  stopped: 'ended by a stop',
  finished: 'its trainer closed: a clean end',
  crashed: 'every process fell silent without closing',
};

/** Ask for a reason, confirm, POST the action. Resolves to the new Control, or null if cancelled. */
export function confirmControl(runId, action, runName) {
  const spec = ACTIONS[action];
  return new Promise((resolve) => {
    let result = null;
    const reason = h('textarea', { id: 'control-reason', rows: 3, required: true, maxlength: 2000,
      placeholder: 'Why? (kept in the audit trail)' });
    const error = h('p', { class: 'form-error', role: 'alert' });
    const submit = h('button', { class: `button ${spec.cls}`, type: 'submit' }, `${spec.verb} run`);
    const form = h('form', { class: 'control-form' },
      h('p', {}, `${spec.verb} `, h('strong', {}, runName), '? ', spec.help),
      h('label', { for: 'control-reason' }, 'Reason'), reason, error,
      h('div', { class: 'actions' }, h('button', { class: 'button', type: 'button', on: { click: () => dialog.close() } }, 'Cancel'), submit));
    const dialog = modal(`${spec.verb} run`, form, { onClose: () => resolve(result) });
    reason.focus();
    form.addEventListener('submit', async (e) => {
      e.preventDefault();
      if (!reason.value.trim()) { error.textContent = 'A reason is required.'; return; }
      submit.disabled = true;
      try {
        result = await api(`/runs/${runId}/control`, { method: 'POST', body: { action, reason: reason.value.trim() } });
        dialog.close();
      } catch (err) {
        submit.disabled = false;
        error.textContent = err.status === 403 ? 'Your token lacks the admin scope.' : err.message;
      }
    });
  });
}

/** State badge + who/why/when + the three buttons (disabled without admin or when not applicable). */
export function renderControls(container, run, me, onChange) {
  const control = run.control;
  const admin = isAdmin(me);
  const buttons = Object.entries(ACTIONS).map(([action, spec]) => {
    const applicable = actionAllowed(action, control.state);
    const title = !admin ? 'Needs a token with the admin scope' : !applicable ? `Not possible while ${control.state}` : spec.help;
    return h('button', { class: `button ${spec.cls}`, dataset: { action }, disabled: !admin || !applicable, title,
      on: { click: async () => { const next = await confirmControl(run.id, action, run.name); if (next) onChange(next); } } }, spec.label);
  });
  clear(container,
    h('div', { class: 'control-state' }, stateBadge(control.state),
      h('span', { class: 'muted small state-help' }, STATE_HELP[control.state] || ''),
      h('span', { class: 'control-meta', title: when(control.updated_at) },
        control.actor ? ['by ', h('strong', { class: 'actor' }, control.actor)] : 'initial state',
        control.reason ? [' · ', h('span', { class: 'reason' }, `“${control.reason}”`)] : '',
        ` · since ${ago(control.updated_at)}`)),
    h('div', { class: 'control-buttons' }, buttons,
      admin ? null : h('span', { class: 'muted small' }, 'Read-only: controls need the admin scope.')));
}
