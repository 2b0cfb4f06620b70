"""trainer_hooks.integrations.verl without verl: importing it costs nothing, and the values its
hooks derive from verl's config are the ones verl uses (the hooks themselves: tests/vllm/test_verl.py)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from trainer_hooks.integrations import verl
from trainer_hooks.monitor import ParityMonitor

CONFIG = {"trainer": {"experiment_name": "qwen3-grpo", "project_name": "math",
                      "paritywatch": {"packs": ["verl", "trl"], "flush_interval_s": 0.5}},
          "actor_rollout_ref": {"rollout": {"temperature": 0.7, "repetition_penalty": 1.0}}}


def test_importing_the_integration_loads_no_framework():
    heavy = ("verl", "ray", "torch", "transformers", "omegaconf", "hydra", "vllm")
    code = ("import sys, trainer_hooks.integrations.verl as v; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_every_process_of_a_job_joins_verls_run_by_its_experiment_name(monkeypatch):
    for name in ("PARITYWATCH_RUN", "PARITYWATCH_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    kwargs = verl.monitor_kwargs(CONFIG, "rollout")
    assert kwargs == {"side": "rollout", "run": "qwen3-grpo", "project": "math", "packs": ["verl", "trl"],
                      "flush_interval_s": 0.5}
    assert verl.monitor_kwargs({"trainer": {"experiment_name": "e"}}, "trainer")["packs"] == ["verl"]
    ParityMonitor(**{**kwargs, "enabled": False})  # arguments ParityMonitor accepts
    monkeypatch.setenv("PARITYWATCH_RUN", "from-env")
    assert "run" not in verl.monitor_kwargs(CONFIG, "trainer")  # HookSettings reads the variable
    with pytest.raises(ValueError, match="side"):
        verl.monitor_kwargs({"trainer": {"paritywatch": {"side": "trainer"}}}, "rollout")


def test_the_recompute_and_the_served_request_as_verl_builds_them():
    assert verl.logprob_assumption(CONFIG) == {"temperature": 0.7}
    request = {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "logprobs": True}
    served = verl.served_request_sampling({"repetition_penalty": 1.1}, request)
    assert served == {**request, "repetition_penalty": 1.1}  # verl's server: setdefault from the config
    assert "repetition_penalty" not in request  # the agent loop's dict is left as it was
    assert verl.served_request_sampling({}, {"temperature": 1.0})["repetition_penalty"] == 1.0


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError):
        verl.NoSuchThing  # noqa: B018
    assert "ParityTrainerMixin" in dir(verl)
