"""Black-box check of a running vLLM OpenAI-compatible server through /tokenize and /detokenize.
One server per case (each takes ~15-30 s to start on CPU)."""
from __future__ import annotations

import httpx

from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer, wait_for
from tests.vllm.conftest import dump, write_template
from trainer_hooks.fingerprint import fingerprint_processor
from trainer_hooks.integrations.vllm import check_openai_server, post_openai_server_check, server_fingerprint
from trainer_hooks.monitor import ParityMonitor


def _parity_of(db_url, tmp_path, trainer_processor, check):
    """Trainer registers its processor, the server check is posted as a rollout: the backend's parity."""
    with ThreadServer(Settings(database_url=db_url)) as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        kwargs = dict(run=f"srv-{tmp_path.name}", project="vllm", url=srv.url, flush_interval_s=0.05,
                      poll_timeout_s=5)
        trainer = ParityMonitor(side="trainer", worker_id="t0", spool_dir=tmp_path / "s-t", **kwargs)
        rollout = ParityMonitor(side="rollout", worker_id="vllm-server", spool_dir=tmp_path / "s-r", **kwargs)
        try:
            trainer.register_processor(trainer_processor).result(timeout=30)
            assert post_openai_server_check(rollout, check)
            assert trainer.flush(10) and rollout.flush(10)
            run_id = api.get("/api/v1/runs", params={"project": "vllm"}).json()["runs"][0]["id"]

            def groups():
                parity = api.get(f"/api/v1/runs/{run_id}/parity").json()
                return parity["groups"] if parity["trainer"] and parity["groups"] else None

            (group,) = wait_for(groups, timeout_s=60)
            keys = {k["key"] for k in api.get(f"/api/v1/runs/{run_id}/metrics").json()["keys"]}
            assert "parity/server_check_error" in keys
            return group
        finally:
            trainer.close()
            rollout.close()


def test_same_processor_server_is_same(vllm_server, hf_tokenizer, sqlite_url, tmp_path):
    with vllm_server() as srv:
        result = check_openai_server(srv.url, hf_tokenizer)
        named = check_openai_server(srv.url + "/v1", hf_tokenizer, model=str(srv.cmd[srv.cmd.index("--model") + 1]))
    assert result["verdict"] == "same", dump(result["components"])
    assert named["verdict"] == "same"
    assert result["probes_compared"] > 40
    assert result["server"]["max_model_len"] == 512
    # the server-built behavior is exactly the local one: the posted digest equals the trainer's
    local = fingerprint_processor(hf_tokenizer)["components"]["behavior"]
    fp = server_fingerprint(result)
    assert set(fp["components"]) == {"behavior", "engine_config"} and fp["kind"] == "openai_server"
    assert fp["components"]["engine_config"]["value"] == {"engine": "openai_server", "max_model_len": 512}
    assert fp["components"]["behavior"]["digest"] == local["digest"]
    group = _parity_of(sqlite_url, tmp_path, hf_tokenizer, result)
    # only behavior is comparable: "info" (the rest is not observable), never "same", never an error
    assert group["verdict"] == "info", dump(group)
    assert all(c["severity"] == "info" for c in group["diff"]["components"])
    assert "behavior" not in {c["name"] for c in group["diff"]["components"]}


def test_server_with_another_chat_template_is_an_error(vllm_server, hf_tokenizer, sqlite_url, tmp_path):
    with vllm_server("--chat-template", str(write_template(tmp_path))) as srv:
        result = check_openai_server(srv.url, hf_tokenizer)
    assert result["verdict"] == "error"
    by_name = {c["name"]: c for c in result["components"]}
    assert set(by_name) == {"chat_template", "behavior"}, dump(result["components"])
    chat = by_name["chat_template"]["detail"]
    assert chat["probe"] == "user/gen=0"  # the first probe conversation: no system message of its own
    assert "multi_turn/gen=1" in chat["differing_conversations"]  # the "<think>" generation prompt
    assert chat["local_ids"] != chat["server_ids"] and chat["first_diff_pos"] is not None
    assert "You are a math tutor." in chat["unified_diff"]  # the server's default system prompt
    # text probes agree: only the chat part of behavior differs
    assert by_name["behavior"]["detail"]["parts"] == ["chat"]
    group = _parity_of(sqlite_url, tmp_path, hf_tokenizer, result)
    assert group["verdict"] == "error"
    assert [c["name"] for c in group["diff"]["components"] if c["severity"] == "error"] == ["behavior"]
