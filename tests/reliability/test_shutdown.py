"""Stopping the server (Ctrl-C, SIGTERM) while hooks long-poll for pause/resume/stop, as every
`make run` and every rolling restart does: each open long-poll answers with the run's current
state, and the server stops without cancelling requests (a 500 and a 50-line traceback per hook
before)."""
from __future__ import annotations

import signal
import threading

import httpx
import pytest

from tests.support.live import ProcessServer, wait_for


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopping_server_answers_open_long_polls_and_logs_no_traceback(tmp_path, sig):
    with ProcessServer(f"sqlite:///{tmp_path / 'stop.db'}") as srv, httpx.Client(base_url=srv.url, timeout=30) as api:
        log_start = srv.log_path.stat().st_size
        run = api.post("/api/v1/runs", json={"name": "stopping"}).json()
        version = api.get(f"/api/v1/runs/{run['id']}/control").json()["version"]
        answers: list[httpx.Response] = []

        def long_poll() -> None:
            answers.append(httpx.get(f"{srv.url}/api/v1/runs/{run['id']}/control/wait",
                                     params={"after_version": version, "timeout": 60}, timeout=90))

        hooks = [threading.Thread(target=long_poll) for _ in range(3)]
        for t in hooks:
            t.start()
        wait_for(lambda: "paritywatch_control_long_polls 3.0" in api.get("/metrics").text, timeout_s=30)
        srv.proc.send_signal(sig)
        for t in hooks:
            t.join(60)
        srv.proc.wait(timeout=30)
        log = srv.log_path.read_bytes()[log_start:].decode(errors="replace")
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert {a.json()["state"] for a in answers} == {"running"}
    assert "Traceback" not in log and "Cancel" not in log, log
