"""Run states and silences in the dashboard (issue 12): the runs list filters by state on the
server, the run page shows the state and its processes, and a silence made in the page mutes a
run's notifications (alerts still show, marked) until someone expires it."""
from __future__ import annotations


import httpx
import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Server, page_problems
from tests.support.live import WebhookReceiver, wait_for

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Its own server: processes count as lost after 1 s, notifications go out at once."""
    srv = Server(tmp_path_factory.mktemp("lifecycle"), env={
        "PARITYWATCH_HEARTBEAT_TIMEOUT_S": "1", "PARITYWATCH_HEARTBEAT_CHECK_INTERVAL_S": "0.2",
        "PARITYWATCH_ALLOW_LOOPBACK_WEBHOOKS": "1", "PARITYWATCH_WEBHOOK_POLL_INTERVAL_S": "0.05",
        "PARITYWATCH_NOTIFY_INTERVAL_S": "0.1", "PARITYWATCH_WEBHOOK_GROUP_WAIT_S": "0",
        "PARITYWATCH_WEBHOOK_GROUP_INTERVAL_S": "0"})
    yield srv
    srv.stop()


def test_the_runs_list_filters_by_state(page, server):
    api = httpx.Client(base_url=f"{server.url}/api/v1", timeout=10)
    names = {}
    for state in ("running", "paused", "finished", "crashed"):
        names[state] = f"{state}-run"
        run_id = api.post("/runs", json={"name": names[state], "project": "states"}).json()["id"]
        if state == "paused":
            api.post(f"/runs/{run_id}/control", json={"action": "pause", "reason": "look"})
        elif state in ("finished", "crashed"):
            comp = api.post(f"/runs/{run_id}/components", json={"side": "trainer", "worker_id": "t0"}).json()
            if state == "finished":
                api.post(f"/runs/{run_id}/components/{comp['id']}/close", json={"reason": "done"})
    wait_for(lambda: api.get("/runs", params={"state": "crashed"}).json()["runs"], timeout_s=20)  # the crash

    page.goto(f"{server.url}/#/runs")
    rows = page.locator("table.runs-table tbody tr[data-run-name]")
    expect(rows).to_have_count(4)
    state = page.get_by_label("State")
    options = state.locator("option").all_inner_texts()
    assert options == ["any state", "running", "paused", "stopping", "stopped", "finished", "crashed"]
    for wanted in ("finished", "crashed", "paused", "running"):
        with page.expect_request(lambda r, wanted=wanted: f"state={wanted}" in r.url):  # filtered by the server
            state.select_option(wanted)
        expect(rows).to_have_count(1)
        expect(rows.first).to_have_attribute("data-run-name", names[wanted])
        expect(rows.first.locator(".state")).to_have_text(wanted)
        expect(rows.first).to_contain_text("since")
    finished_row = None
    state.select_option("finished")
    finished_row = rows.first
    expect(finished_row).to_contain_text("1 closed")
    state.select_option("stopped")
    expect(page.locator("table.runs-table tbody")).to_contain_text("No run matches these filters.")
    state.select_option("")
    expect(rows).to_have_count(4)

    finished_id = api.get("/runs", params={"state": "finished"}).json()["runs"][0]["id"]
    page.goto(f"{server.url}/#/runs/{finished_id}")
    expect(page.locator(".controls .state")).to_have_text("finished")
    expect(page.locator(".controls")).to_contain_text("its trainer closed")
    expect(page.locator(".run-facts .processes")).to_have_text("processes: 0 live · 1 closed · 0 lost")
    expect(page.locator(".run-facts .ended")).to_contain_text("ended")
    assert page_problems(page) == {"csp": [], "errors": []}


def test_a_silence_made_in_the_page_mutes_the_run_until_it_is_expired(page, server):
    api = httpx.Client(base_url=f"{server.url}/api/v1", timeout=10)
    with WebhookReceiver() as rx:
        api.post("/webhooks", json={"url": rx.url, "events": ["alert.firing", "alert.resolved"]}).raise_for_status()
        run = api.post("/runs", json={"name": "muted-run", "project": "silences"}).json()
        api.post(f"/runs/{run['id']}/rules", json={"key": "reward", "comparison": "<", "threshold": 0.5}).raise_for_status()
        page.goto(f"{server.url}/#/runs/{run['id']}")
        expect(page.locator("#silences")).to_contain_text("Notifications are on.")

        page.get_by_role("button", name="Silence…").click()
        dialog = page.locator("dialog")
        expect(dialog.get_by_label("Mute")).to_have_value("run")
        dialog.get_by_label("For").select_option(label="1 hour")
        dialog.get_by_role("button", name="Silence").click()
        assert dialog.get_by_label("Reason").evaluate("e => e.validity.valueMissing")  # why is not optional
        expect(page.locator("#silences li.silence")).to_have_count(0)
        dialog.get_by_label("Reason").fill("draining node-7 <b>now</b>")
        dialog.get_by_role("button", name="Silence").click()
        silence = page.locator("#silences li.silence")
        expect(silence).to_have_count(1)
        expect(silence).to_contain_text(f"run {run['id']}")
        expect(silence).to_contain_text("“draining node-7 <b>now</b>”")  # shown as text

        # a new alert of the silenced run: it shows, marked, and nothing is sent
        api.post(f"/runs/{run['id']}/metrics", json={"client_id": "c", "seq": 1, "steps": [1],
                                                      "series": {"reward": [0.1]}}).raise_for_status()
        alert = page.locator("#alerts li.alert-item[data-kind=metric_threshold]")
        expect(alert).to_have_attribute("data-silenced", "1", timeout=20_000)
        expect(alert.locator(".silenced")).to_have_text("silenced")
        [silenced] = api.get(f"/runs/{run['id']}/alerts").json()["alerts"]
        assert silenced["silenced"] and silenced["status"] == "firing"
        # the same alert in a run nobody silenced is sent: once it arrives, the notifier has
        # looked at both groups, and the silenced one sent nothing
        loud = api.post("/runs", json={"name": "loud-run", "project": "silences"}).json()
        api.post(f"/runs/{loud['id']}/rules", json={"key": "reward", "comparison": "<", "threshold": 0.5})
        api.post(f"/runs/{loud['id']}/metrics", json={"client_id": "c2", "seq": 1, "steps": [1], "series": {"reward": [0.1]}})
        wait_for(lambda: rx.accepted(), timeout_s=20)  # the other run's notification
        assert [r.json["data"]["run"]["id"] for r in rx.accepted()] == [loud["id"]]

        silence.get_by_role("button", name="Expire now").click()
        expect(page.locator("#silences")).to_contain_text("Notifications are on.")
        expect(alert).to_have_attribute("data-silenced", "0")
        wait_for(lambda: len(rx.accepted()) == 2, timeout_s=20)  # the one the silence held back
        got = rx.accepted()[1]
        assert got.json["type"] == "alert.firing" and got.json["data"]["run"]["id"] == run["id"]
        audit = api.get("/silences", params={"state": "all", "run_id": run["id"]}).json()["silences"]
        assert [(s["reason"], s["created_by"] is not None, s["ended_by"] is not None) for s in audit] == [
            ("draining node-7 <b>now</b>", True, True)]
    assert page.evaluate("document.querySelectorAll('#silences b').length") == 0
    assert page_problems(page) == {"csp": [], "errors": []}


def test_silences_made_elsewhere_show_on_an_open_run_page_at_once(page, server):
    """Issue 25.5: `silenced` shown consistently. A silence created or ended outside the page (the
    API, another admin, or one that runs out) marks and unmarks the open page's alerts, and the
    header counts them, with no reload."""
    api = httpx.Client(base_url=f"{server.url}/api/v1", timeout=10)
    run = api.post("/runs", json={"name": "hushed-elsewhere", "project": "silences-2"}).json()
    api.post(f"/runs/{run['id']}/rules", json={"key": "reward", "comparison": "<", "threshold": 0.5}).raise_for_status()
    api.post(f"/runs/{run['id']}/metrics", json={"client_id": "hushed", "seq": 1, "steps": [1],
                                                  "series": {"reward": [0.1]}}).raise_for_status()
    page.goto(f"{server.url}/#/runs/{run['id']}")
    alert = page.locator("#alerts li.alert-item[data-kind=metric_threshold]")
    expect(alert).to_have_attribute("data-silenced", "0")
    head = page.locator(".run-facts .firing")
    expect(head).to_have_text("firing: 1 warning")

    live = 20_000  # the page hears of it through its event stream (one poll every 0.5 s), then reloads
    silence = api.post("/silences", json={"project": "silences-2", "duration_s": 3600, "reason": "maintenance"}).json()
    expect(alert).to_have_attribute("data-silenced", "1", timeout=live)
    expect(head).to_have_text("firing: 1 warning1 silenced", timeout=live)
    expect(page.locator("#silences li.silence")).to_contain_text("project silences-2", timeout=live)

    api.post(f"/silences/{silence['id']}/expire").raise_for_status()
    expect(alert).to_have_attribute("data-silenced", "0", timeout=live)
    expect(head).to_have_text("firing: 1 warning", timeout=live)
    expect(page.locator("#silences")).to_contain_text("Notifications are on.", timeout=live)
    assert page_problems(page) == {"csp": [], "errors": []}


def test_the_webhooks_page_offers_every_event_the_api_sends_and_sets_grouping(page, server):
    """Issue 17.3: the dashboard offered two event types while the API accepted five."""
    offered_by_api = [e["type"] for e in httpx.get(f"{server.url}/api/v1/webhook-events").json()["events"]]
    page.goto(f"{server.url}/#/settings")
    form = page.locator("form", has_text="Add a webhook")
    boxes = form.locator("fieldset.events input[name=events]")
    expect(boxes).to_have_count(len(offered_by_api))
    assert [b.get_attribute("value") for b in boxes.all()] == offered_by_api
    assert "run.control" in offered_by_api and "alert.acknowledged" in offered_by_api
    form.locator("input[name=url]").fill("http://127.0.0.1:9/grouped")
    form.locator("input[name=group_by][value=project]").check()
    form.locator("input[name=group_wait_s]").fill("30")
    form.locator("button[type=submit]").click()
    card = page.locator("article.webhook", has_text="127.0.0.1:9/grouped")
    expect(card.locator(".grouping")).to_have_text(
        "grouped by project · wait 30 s · changes every 0 s · repeat every 4 h")
    assert page_problems(page) == {"csp": [], "errors": []}
