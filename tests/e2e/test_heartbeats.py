from paritywatch.backend.main import create_app
from paritywatch.backend.settings import Settings
from tests.support.live import first_within, local_client, wait_for


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

        def left_stopping_despite_a_heartbeat():  # noqa: ANN202  a live trainer heartbeats every 0.2 s
            api.post(f"/api/v1/runs/{rid}/components/{comp['id']}/heartbeat")
            state = api.get(f"/api/v1/runs/{rid}/control").json()["state"]
            return state if state != "stopping" else None

        # a live trainer keeps the run stopping, through more than twice the heartbeat timeout
        assert first_within(left_stopping_despite_a_heartbeat, window_s=2.5, interval_s=0.2) is None
        control = wait_for(lambda: (c := api.get(f"/api/v1/runs/{rid}/control").json())["state"] == "stopped" and c,
                           timeout_s=10)
        assert control["actor"] == "paritywatch" and "heartbeat" in control["reason"]
