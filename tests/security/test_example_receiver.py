"""examples/webhook_receiver.py: clear 4xx answers (never a traceback), a bounded body, and
replay protection that survives a restart; and it accepts what Paritywatch really sends."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid

import httpx
import pytest

from paritywatch.backend.settings import Settings
from paritywatch.backend.webhooks import signing
from tests.support.live import ROOT, ThreadServer, free_port, wait_for

SECRET = signing.new_secret()


class Receiver:
    """The example, as a user runs it: its own process, printing to stdout."""

    def __init__(self, state, port: int):
        self.state, self.port = state, port
        self.url = f"http://127.0.0.1:{port}/"

    def __enter__(self) -> "Receiver":
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "examples" / "webhook_receiver.py"), "--port", str(self.port),
             "--secret", SECRET, "--state", str(self.state), "--max-body", "65536"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(self._listening, timeout_s=20, interval_s=0.05)
        return self

    def _listening(self) -> bool:
        assert self.proc.poll() is None, self.proc.communicate()
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            return True
        except OSError:
            return False

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.out, self.err = self.proc.communicate(timeout=10)
        assert "Traceback" not in self.err, self.err


def signed(body: bytes, msg_id: str | None = None, ts: int | None = None) -> dict:
    return signing.headers_for(SECRET, msg_id or f"msg_{uuid.uuid4().hex}", ts or int(time.time()), body)


BODY = b'{"type":"alert.firing","data":{"alert":{"severity":"error","title":"processor mismatch"}}}'


def test_bad_requests_get_clear_answers(tmp_path):
    with Receiver(tmp_path / "seen.sqlite", free_port()) as rx:
        good = signed(BODY)
        for missing in ("webhook-id", "webhook-timestamp", "webhook-signature"):
            headers = {k: v for k, v in good.items() if k != missing}
            assert httpx.post(rx.url, content=BODY, headers=headers).status_code == 400, missing
        assert httpx.post(rx.url, content=BODY, headers={**good, "webhook-timestamp": "soon"}).status_code == 400
        assert httpx.post(rx.url, content=BODY, headers={**good, "webhook-signature": "v1,AAAA"}).status_code == 401
        assert httpx.post(rx.url, content=BODY, headers={**good, "webhook-signature": "garbage"}).status_code == 401
        assert httpx.post(rx.url, content=BODY + b" ", headers=good).status_code == 401
        stale = signed(BODY, ts=int(time.time()) - 3600)
        assert httpx.post(rx.url, content=BODY, headers=stale).status_code == 401
        big = b'{"x":"' + b"a" * 100_000 + b'"}'
        assert httpx.post(rx.url, content=big, headers=signed(big)).status_code == 413
        with socket.create_connection(("127.0.0.1", rx.port)) as sock:  # no Content-Length at all
            sock.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
            assert sock.makefile("rb").readline().split()[1] == b"411"
        assert httpx.post(rx.url, content=BODY, headers=good).status_code == 204
    assert rx.out.count("alert.firing: error processor mismatch") == 1


def test_replays_are_refused_across_restarts(tmp_path):
    headers = signed(BODY, msg_id="msg_replayed_once")
    port = free_port()
    with Receiver(tmp_path / "seen.sqlite", port) as first:
        assert httpx.post(first.url, content=BODY, headers=headers).status_code == 204
        assert httpx.post(first.url, content=BODY, headers=headers).status_code == 204  # acknowledged...
    with Receiver(tmp_path / "seen.sqlite", port) as restarted:
        assert httpx.post(restarted.url, content=BODY, headers=headers).status_code == 204
    assert first.out.count("alert.firing") == 1  # ...but processed once
    assert restarted.out.count("alert.firing") == 0


def test_it_accepts_what_paritywatch_sends_and_says_something_useful_for_every_event(tmp_path, sqlite_db):
    """Issue 29.8: the test event printed "test:" and nothing else."""
    port = free_port()
    settings = Settings(database_url=sqlite_db, allow_loopback_webhooks=True, webhook_poll_interval_s=0.05,
                        webhook_group_wait_s=0, webhook_group_interval_s=0, notify_interval_s=0.05,
                        public_url="https://pw.example.org")
    with Receiver(tmp_path / "seen.sqlite", port) as rx, ThreadServer(settings) as srv:
        api = httpx.Client(base_url=srv.url + "/api/v1")
        hook = api.post("/webhooks", json={"url": rx.url}).json()
        # the receiver holds its own secret: make the webhook's match it for this test
        from paritywatch.backend.models import Webhook

        with srv.app.state.db.write() as s:
            s.get(Webhook, hook["id"]).secret = srv.app.state.dispatcher.box.seal(SECRET)
        api.post(f"/webhooks/{hook['id']}/test")
        run_id = api.post("/runs", json={"name": "grpo", "project": "lab"}).json()["id"]
        api.post(f"/runs/{run_id}/control", json={"action": "pause", "reason": "checking the template"})
        api.post(f"/runs/{run_id}/rules", json={"key": "loss", "comparison": ">", "threshold": 1.0})
        api.post(f"/runs/{run_id}/metrics", json={"client_id": "c", "seq": 0, "steps": [1], "series": {"loss": [9.0]}})
        alert = wait_for(lambda: api.get(f"/runs/{run_id}/alerts").json()["alerts"], timeout_s=15)[0]
        api.post(f"/alerts/{alert['id']}/acknowledge", json={"note": "on it"})

        def delivered() -> list[str]:
            deliveries = api.get(f"/webhooks/{hook['id']}/deliveries").json()["deliveries"]
            return sorted(d["event_type"] for d in deliveries if d["status"] == "delivered")

        wait_for(lambda: delivered() == ["alert.acknowledged", "alert.firing", "run.control", "test"], timeout_s=20)
    lines = {line.split(":", 1)[0]: line for line in rx.out.splitlines() if ":" in line}
    link = f"https://pw.example.org/#/runs/{run_id}"
    assert lines["test"].startswith("test: Paritywatch test event: this webhook works https://pw.example.org")
    assert lines["run.control"] == (f"run.control: run lab/grpo is now paused (by open-loopback: "
                                    f"checking the template) {link}")
    assert lines["alert.firing"].startswith("alert.firing: [FIRING] 1 metric_threshold alert in lab/grpo: loss last=9 > 1")
    assert link in lines["alert.firing"]
    assert lines["alert.acknowledged"] == ("alert.acknowledged: open-loopback acknowledged warning 'loss last=9 > 1' "
                                           f"(on it) — run lab/grpo {link}")


def test_a_run_that_ended_tainted_and_an_unknown_event_still_say_something(tmp_path):
    """The payload of run.ended_tainted (a run that trained while a divergence was open), and of a
    type this receiver was not written for."""
    tainted = json.dumps({"type": "run.ended_tainted", "data": {
        "run": {"project": "lab", "name": "grpo", "url": "https://pw.example.org/#/runs/7"},
        "control": {"state": "finished", "actor": "trainer t0", "reason": None},
        "taint": {"tainted": True, "first_step": 212, "ranges_total": 1,
                  "ranges": [{"summary": "steps 212–251: chat_template differs on 1 of 3 rollout workers"}]}}}).encode()
    unknown = b'{"type":"run.renamed","data":{"from":"a","to":"b"}}'
    with Receiver(tmp_path / "seen.sqlite", free_port()) as rx:
        for body in (tainted, unknown):
            assert httpx.post(rx.url, content=body, headers=signed(body)).status_code == 204
    assert ("run.ended_tainted: run lab/grpo is now finished (by trainer t0); trained on tainted steps from step 212 "
            "(steps 212–251: chat_template differs on 1 of 3 rollout workers) https://pw.example.org/#/runs/7") in rx.out
    assert 'run.renamed: {"from": "a", "to": "b"}' in rx.out


@pytest.mark.parametrize("twice", [False, True])
def test_standard_webhooks_published_vector(twice):
    """The reference implementation's published vector (standard-webhooks, libraries/python/tests/
    test_webhooks.py::test_sign_function): our signatures are the specification's, not only
    consistent with our own verifier."""
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    msg_id, ts, body = "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}'
    expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    assert signing.sign(secret, msg_id, ts, body) == expected
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(ts),
               "webhook-signature": ("v1,bm9wZQ== " if twice else "") + expected}
    signing.verify(secret, headers, body, now=ts)  # several signatures (key rotation): one must match
    with pytest.raises(signing.SignatureError):
        signing.verify(secret, {**headers, "webhook-signature": expected.replace("E=", "A=")}, body, now=ts)
    with pytest.raises(signing.SignatureError, match="replay"):
        signing.verify(secret, headers, body, now=ts + signing.DEFAULT_TOLERANCE_S + 1)
