"""The wire contract against what the backend really serves (issue 28.2): every path the hooks call is
a route of the API (method and path, by the OpenAPI schema), built by the contract's path builders,
never spelled in a hook module; the control transitions the dashboard offers are the server's."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from paritywatch.backend.main import create_app
from paritywatch.backend.settings import Settings
from trainer_hooks import contract

HOOKS = Path(contract.__file__).resolve().parent
# Talks to a vLLM server, not to Paritywatch: its paths are vLLM's.
OTHER_SERVERS = {HOOKS / "integrations" / "openai_server.py"}


@pytest.fixture(scope="module")
def schema_app(tmp_path_factory):
    return create_app(Settings(database_url=f"sqlite:///{tmp_path_factory.mktemp('wire') / 'never-opened.db'}"))


def _template(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


def _served(app) -> set[tuple[str, str]]:
    paths = app.openapi()["paths"]
    return {(method.upper(), _template(path[len(contract.API_PREFIX):]))
            for path, ops in paths.items() for method in ops}


def _path_expression(call: ast.Call, assigned: dict[str, ast.expr]) -> ast.expr:
    path = call.args[1]
    return assigned.get(path.id, path) if isinstance(path, ast.Name) else path


def _template_of(expr: ast.expr) -> str:
    """The contract path an argument builds, with its ids as placeholders; fails on anything else."""
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "contract":
        return getattr(contract, expr.attr)
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr in ("run_path", "component_path"):
        tail = expr.args[-1]
        assert isinstance(tail, ast.Constant), f"line {expr.lineno}: the tail must be a literal"
        ids = ["{run_id}", "{component_id}"][: len(expr.args) - 1]
        return getattr(contract, expr.func.attr)(*ids, tail.value)
    raise AssertionError(f"line {expr.lineno}: a path the hooks call must come from trainer_hooks.contract, "
                         f"not {ast.unparse(expr)}")


def hook_calls() -> set[tuple[str, str, str]]:
    """(module, method, path template) of every `transport.request(...)` in the hooks."""
    calls = set()
    for module in sorted(HOOKS.rglob("*.py")):
        if module in OTHER_SERVERS:
            continue
        tree = ast.parse(module.read_text())
        assigned = {t.id: node.value for node in ast.walk(tree) if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "request" \
                    and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant):
                where = f"{module.relative_to(HOOKS)}"
                try:
                    path = _template_of(_path_expression(node, assigned))
                except AssertionError as exc:
                    raise AssertionError(f"{where}: {exc}") from None
                calls.add((where, node.args[0].value, path))
    return calls


def test_every_path_the_hooks_call_is_served_by_the_backend(schema_app):
    calls = hook_calls()
    # the hooks' whole conversation: a lost call site would shrink this set unnoticed
    assert {path for _, _, path in calls} >= {
        "/whoami", "/runs", "/runs/{run_id}/components", "/runs/{run_id}/metrics", "/runs/{run_id}/audits",
        "/runs/{run_id}/control/wait", "/runs/{run_id}/control/stopped",
        "/runs/{run_id}/components/{component_id}/heartbeat", "/runs/{run_id}/components/{component_id}/close",
        "/runs/{run_id}/components/{component_id}/fingerprint",
        "/runs/{run_id}/components/{component_id}/attestations"}
    served = _served(schema_app)
    unserved = sorted(f"{where}: {method} {path}" for where, method, path in calls
                      if (method, _template(path)) not in served)
    assert not unserved, "hook calls the backend does not serve:\n" + "\n".join(unserved)


def test_a_path_spelled_in_a_hook_module_is_caught():
    """The check above reads the call sites: an f-string path fails it by name."""
    tree = ast.parse('def send(transport, run_id):\n    transport.request("POST", f"/runs/{run_id}/metric")\n')
    [call] = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "request"]
    with pytest.raises(AssertionError, match="must come from trainer_hooks.contract"):
        _template_of(_path_expression(call, {}))


def test_the_dashboard_offers_the_transitions_the_server_enforces(client):
    config = client.get(contract.API_PREFIX + "/ui-config").json()
    assert config["control_actions"] == {
        action: {"allowed_from": list(allowed_from), "target": target}
        for action, (allowed_from, target) in contract.RUN_CONTROL_ACTIONS.items()}
    assert config["live_run_states"] == list(contract.LIVE_RUN_STATES)
    run_id = client.post(contract.API_PREFIX + "/runs", json={"name": "wire"}).json()["id"]
    for action in ("pause", "resume", "pause", "stop"):
        state = client.get(f"{contract.API_PREFIX}/runs/{run_id}/control").json()["state"]
        allowed = state in config["control_actions"][action]["allowed_from"]
        answer = client.post(f"{contract.API_PREFIX}/runs/{run_id}/control", json={"action": action, "reason": "t"})
        assert (answer.status_code == 200) == allowed, (action, state, answer.text)
    # a stopping run cannot be resumed: the dashboard offers no Resume, the server refuses it
    state = client.get(f"{contract.API_PREFIX}/runs/{run_id}/control").json()["state"]
    assert state not in config["control_actions"]["resume"]["allowed_from"]
    refused = client.post(f"{contract.API_PREFIX}/runs/{run_id}/control", json={"action": "resume", "reason": "t"})
    assert refused.status_code == 409
