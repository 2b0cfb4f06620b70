import threading
import time
from datetime import datetime, timezone

import httpx

from paritywatch.backend.main import create_app
from paritywatch.backend.models import utcnow
from paritywatch.backend.settings import Settings
from tests.support.live import ThreadServer, first_within, local_client, wait_for, wait_for_sweeps


def test_silent_component_raises_heartbeat_lost_and_recovers(db_url):
    settings = Settings(database_url=db_url, heartbeat_timeout_s=0.5, heartbeat_check_interval_s=0.1, open_mode=True)
    with local_client(create_app(settings, upgrade_schema=False)) as api:
        rid = api.post("/api/v1/runs", json={"name": "r"}).json()["id"]
        comp = api.post(f"/api/v1/runs/{rid}/components", json={"side": "rollout", "worker_id": "w7", "host": "gpu-3"}).json()

        def open_alerts():
            return api.get(f"/api/v1/runs/{rid}/alerts", params={"status": "open"}).json()["alerts"]

        alert = wait_for(open_alerts, timeout_s=10)[0]
        assert alert["kind"] == "heartbeat_lost" and "w7" in alert["title"] and "gpu-3" in alert["title"]
        api.post(f"/api/v1/runs/{rid}/components/{comp['id']}/heartbeat")
        wait_for(lambda: not open_alerts(), timeout_s=10)
        resolved = api.get(f"/api/v1/runs/{rid}/alerts").json()["alerts"][0]
        assert resolved["status"] == "resolved"


def test_a_stop_nobody_acknowledges_completes_once_the_run_falls_silent(db_url):
    """The trainer died instead of reporting the end of its loop: the run does not stay
    `stopping` forever; it becomes `stopped` once no process has heartbeated for the timeout."""
    settings = Settings(database_url=db_url, heartbeat_timeout_s=1.0, heartbeat_check_interval_s=0.1, open_mode=True)
    with local_client(create_app(settings, upgrade_schema=False)) as api:
        rid = api.post("/api/v1/runs", json={"name": "abandoned"}).json()["id"]
        comp = api.post(f"/api/v1/runs/{rid}/components", json={"side": "trainer", "worker_id": "t0"}).json()
        assert api.post(f"/api/v1/runs/{rid}/control", json={"action": "stop", "reason": "enough"}).status_code == 200

        def left_stopping_despite_a_heartbeat():
            api.post(f"/api/v1/runs/{rid}/components/{comp['id']}/heartbeat")
            state = api.get(f"/api/v1/runs/{rid}/control").json()["state"]
            return state if state != "stopping" else None

        # a live trainer keeps the run stopping, through more than twice the heartbeat timeout
        assert first_within(left_stopping_despite_a_heartbeat, window_s=2.5, interval_s=0.2) is None
        control = wait_for(lambda: (c := api.get(f"/api/v1/runs/{rid}/control").json())["state"] == "stopped" and c,
                           timeout_s=10)
        assert control["actor"] == "paritywatch" and "heartbeat" in control["reason"]


# ------------------------------------------------------- the backend's own deafness (backend/alerts/hearing.py)

DEAF_TIMEOUT_S = 2.0
DEAF_SETTINGS = dict(heartbeat_timeout_s=DEAF_TIMEOUT_S, heartbeat_check_interval_s=0.1, open_mode=True)


def _all_alerts(api: httpx.Client, run_id: int) -> list[dict]:
    return api.get(f"/api/v1/runs/{run_id}/alerts").json()["alerts"]


def test_a_backend_down_for_longer_than_the_timeout_blames_no_process_when_it_returns(db_url):
    """A restart (an upgrade, a crash) heard nobody: before, its first sweep marked every process
    of every run lost, crashed the run and paged. Silence counts only once it listens again."""
    settings = Settings(database_url=db_url, **DEAF_SETTINGS)
    with ThreadServer(settings) as first, httpx.Client(base_url=first.url, timeout=30) as api:
        run_id = api.post("/api/v1/runs", json={"name": "restarted"}).json()["id"]
        comp = api.post(f"/api/v1/runs/{run_id}/components", json={"side": "trainer", "worker_id": "t0"}).json()
        api.post(f"/api/v1/runs/{run_id}/components/{comp['id']}/heartbeat").raise_for_status()
        last_beat = time.monotonic()
    wait_for(lambda: time.monotonic() > last_beat + 2 * DEAF_TIMEOUT_S, timeout_s=30)  # down twice the timeout
    with ThreadServer(settings) as second, httpx.Client(base_url=second.url, timeout=30) as api:
        # A process that stays silent once the backend listens again is still lost, but only after
        # the backend has listened for the whole timeout: before, the first sweep blamed it at once.
        # (Judged on the alert's own time, not on how many sweeps ran first: on a loaded machine
        # three sweeps can take longer than the 2 s timeout, and the loss is then due.)
        [lost] = wait_for(lambda: _all_alerts(api, run_id), timeout_s=DEAF_TIMEOUT_S + 30)
        assert lost["kind"] == "heartbeat_lost" and lost["detail"]["worker_id"] == "t0"
        fired = datetime.fromisoformat(lost["fired_at"])
        fired = fired if fired.tzinfo else fired.replace(tzinfo=timezone.utc)
        listened_s = fired.timestamp() - second.app.state.engine.hearing.started
        assert listened_s >= DEAF_TIMEOUT_S, f"blamed {listened_s:.2f} s after the backend began to listen"


def test_a_stalled_event_loop_blames_no_process_that_kept_beating(db_url, caplog):
    """The serving loop blocked for more than the timeout while a process heartbeated every 0.2 s
    (its beats waited in the socket): before, the sweep's thread, which went on, marked it lost."""
    with ThreadServer(Settings(database_url=db_url, **DEAF_SETTINGS)) as srv, \
            httpx.Client(base_url=srv.url, timeout=30) as api:
        run_id = api.post("/api/v1/runs", json={"name": "stalled"}).json()["id"]
        comp = api.post(f"/api/v1/runs/{run_id}/components", json={"side": "rollout", "worker_id": "r0"}).json()
        beating = threading.Event()
        beating.set()

        def beat() -> None:
            with httpx.Client(base_url=srv.url, timeout=30) as hook:
                while beating.is_set():
                    hook.post(f"/api/v1/runs/{run_id}/components/{comp['id']}/heartbeat").raise_for_status()
                    beating.wait(0.2)  # the hook's interval, not a synchronisation

        beater = threading.Thread(target=beat, daemon=True)
        beater.start()
        wait_for(lambda: srv.app.state.engine.hearing.cutoff(utcnow(), DEAF_TIMEOUT_S) is not None, timeout_s=30)
        swept = srv.app.state.engine.sweeps
        srv.stall_event_loop(2.5 * DEAF_TIMEOUT_S)
        api.get("/healthz").raise_for_status()  # answered once the loop runs again
        assert srv.app.state.engine.sweeps > swept + 10, "the sweep did not go on during the stall"
        wait_for_sweeps(srv, 3)
        try:
            assert _all_alerts(api, run_id) == []
            assert any("event loop did not run" in r.getMessage() for r in caplog.records), "the stall went unsaid"
        finally:
            beating.clear()
            beater.join(30)
        # It stops beating: lost, as before.
        [lost] = wait_for(lambda: _all_alerts(api, run_id), timeout_s=DEAF_TIMEOUT_S + 20)
        assert lost["kind"] == "heartbeat_lost" and lost["detail"]["worker_id"] == "r0"
