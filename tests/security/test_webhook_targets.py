"""Issue 13.3: webhooks reach public hosts only, at creation AND at delivery, through the address
that was checked, never through a proxy from the environment; of a failed answer only its status
and size are kept.

Nothing here sends traffic to a denied address: names resolve through the stub of the `network`
fixture, and any connection to a non-loopback address is recorded and refused by its guard. The
tests assert that the guard never had to act."""
from __future__ import annotations

import pytest
from sqlalchemy import select

from paritywatch.backend.db import Database
from paritywatch.backend.main import create_app
from paritywatch.backend.models import DeliveryAttempt, Webhook, WebhookDelivery
from paritywatch.backend.settings import Settings
from paritywatch.backend.webhooks.dispatcher import Dispatcher
from paritywatch.backend.webhooks.outbox import enqueue_for
from paritywatch.backend.webhooks.signing import new_secret
from tests.support.live import WebhookReceiver, local_client

PUBLIC = "93.184.216.34"
STUB_NAMES = {
    "private.example": ["10.0.0.1"],
    "private172.example": ["172.20.1.1"],
    "private192.example": ["192.168.1.1"],
    "cgnat.example": ["100.64.0.1"],
    "metadata.example": ["169.254.169.254"],
    "ula.example": ["fd00::1"],
    "sitelocal.example": ["fec0::1"],
    "mapped.example": ["::ffff:10.0.0.1"],
    "zero.example": ["0.0.0.0"],
    "mixed.example": [PUBLIC, "192.168.0.10"],  # one bad answer is enough to refuse
    "localhost": ["127.0.0.1", "::1"],
}
DENIED_URLS = [
    *(f"http://{ip}/hook" for ip in (
        "10.0.0.1", "10.255.255.254", "172.16.0.1", "172.31.255.254", "192.168.1.1", "100.64.0.1",
        "100.127.255.254", "100.100.100.200", "169.254.169.254", "169.254.1.1", "169.254.170.2", "168.63.129.16",
        "0.0.0.0", "0.1.2.3", "127.0.0.1", "127.1.2.3", "224.0.0.1", "239.255.255.250", "240.0.0.1",
        "255.255.255.255", "192.0.0.1", "192.0.2.1", "198.18.0.1", "198.51.100.1", "203.0.113.1")),
    *(f"http://[{ip}]/hook" for ip in (
        "::1", "::", "fc00::1", "fd12:3456::1", "fd00:ec2::254", "fec0::1", "fe80::1", "ff02::1",
        "::ffff:10.0.0.1", "::ffff:a00:1", "::ffff:169.254.169.254", "::ffff:127.0.0.1", "::10.0.0.1",
        "64:ff9b::a00:1", "64:ff9b:1::1", "2002:a00:1::1", "2001::1", "2001:db8::1", "100::1")),
    "http://[fe80::1%25eth0]/hook",
    # legacy numeric spellings that resolvers read as IPv4
    "http://2130706433/hook", "http://167772161/hook", "http://0x7f.1/hook", "http://0177.0.0.1/hook",
    "http://10.1/hook", "http://0x0a000001/hook",
    *(f"https://{name}/hook" for name in STUB_NAMES),
]


@pytest.fixture
def db_and_settings(sqlite_db):
    settings = Settings(database_url=sqlite_db, open_mode=True, webhook_backoff_base_s=0.01,
                        webhook_timeout_s=5)
    db = Database(sqlite_db)
    yield db, settings
    db.dispose()


def test_every_denied_form_is_refused_when_the_webhook_is_created(network, sqlite_db):
    network.names.update(STUB_NAMES, **{"public.example": [PUBLIC]})
    app = create_app(Settings(database_url=sqlite_db, open_mode=True), upgrade_schema=False)
    with local_client(app) as api:
        accepted = [url for url in DENIED_URLS
                    if api.post("/api/v1/webhooks", json={"url": url}).status_code != 422]
        assert accepted == [], f"accepted: {accepted}"
        assert api.get("/api/v1/webhooks").json()["webhooks"] == []
        # A public host passes; a chosen network can be allowed, cloud metadata never.
        assert api.post("/api/v1/webhooks", json={"url": "https://public.example/hook"}).status_code == 200
    app = create_app(Settings(database_url=sqlite_db, open_mode=True,
                              webhook_allowed_networks="10.0.0.0/8, 169.254.0.0/16"), upgrade_schema=False)
    with local_client(app) as api:
        assert api.post("/api/v1/webhooks", json={"url": "https://private.example/hook"}).status_code == 200
        assert api.post("/api/v1/webhooks", json={"url": "http://169.254.169.254/"}).status_code == 422
    assert network.blocked == []


def _queue(db: Database, urls: list[str]) -> dict[int, str]:
    """Webhook rows written directly (as if they had passed an earlier check), one delivery each."""
    out = {}
    with db.write() as s:
        for url in urls:
            hook = Webhook(url=url, format="standard", events=[], secret=new_secret())
            s.add(hook)
            s.flush()
            delivery = enqueue_for(s, hook, "test", {"message": "hi"})
            s.flush()
            out[delivery.id] = url
    return out


def _drain(dispatcher: Dispatcher, rounds: int = 20) -> None:
    for _ in range(rounds):
        if not dispatcher.run_once():
            return


def test_every_denied_form_is_refused_at_delivery_without_connecting(network, db_and_settings):
    """The checks run again when sending: DNS may have changed since the webhook was created."""
    db, settings = db_and_settings
    network.names.update(STUB_NAMES)
    queued = _queue(db, DENIED_URLS)
    _drain(Dispatcher(db, settings))
    with db.read() as s:
        rows = {d.id: d for d in s.scalars(select(WebhookDelivery))}
    not_refused = {queued[i]: (rows[i].status, rows[i].last_error) for i in queued
                   if rows[i].status != "failed" or not (rows[i].last_error or "").startswith("refused")}
    assert not_refused == {}
    assert network.blocked == [], "a connection to a denied address was attempted"


def test_the_checked_address_is_the_one_connected_to(network, db_and_settings):
    """A name that answers loopback (allowed here) to the check and a private address to a second
    lookup: the delivery goes to the checked address; nothing resolves the name twice."""
    db, settings = db_and_settings
    settings = settings.model_copy(update={"allow_loopback_webhooks": True})
    with WebhookReceiver() as rx:
        port = rx.url.split(":")[2].split("/")[0]
        network.sequences["rebind.example"] = [["127.0.0.1"], ["10.0.0.1"]]
        _queue(db, [f"http://rebind.example:{port}/hook"])
        _drain(Dispatcher(db, settings))
        assert len(rx.accepted()) == 1
        assert rx.accepted()[0].headers["host"] == f"rebind.example:{port}"  # Host names the URL's host
    assert network.blocked == []


def test_a_proxy_in_the_environment_is_not_used(network, db_and_settings, monkeypatch):
    """HTTP(S)_PROXY would route deliveries around the address checks (and leak them)."""
    db, settings = db_and_settings
    settings = settings.model_copy(update={"allow_loopback_webhooks": True})
    with WebhookReceiver() as rx, WebhookReceiver() as proxy:
        proxy_url = proxy.url.rsplit("/", 1)[0]
        for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            monkeypatch.setenv(var, proxy_url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        port = rx.url.split(":")[2].split("/")[0]
        network.names["receiver.example"] = ["127.0.0.1"]
        _queue(db, [f"http://receiver.example:{port}/hook"])
        _drain(Dispatcher(db, settings))
        assert proxy.received == []
        assert len(rx.accepted()) == 1
    assert network.blocked == []


def test_a_failed_answer_is_logged_by_status_and_size_never_its_text(network, db_and_settings):
    """An internal page behind the URL must not become readable in the delivery log; a gzip bomb
    is not decompressed."""
    import gzip

    from tests.security.servers import ScriptedServer

    db, settings = db_and_settings
    settings = settings.model_copy(update={"allow_loopback_webhooks": True})
    page = b"<html>SECRET-INTERNAL-PAGE " + b"x" * 50_000 + b"</html>"
    bomb = gzip.compress(b"SECRET-INTERNAL-PAGE" * 500_000)  # 10 MB once inflated
    answers = {
        "plain": b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s"
                 % (len(page), page),
        "bomb": b"HTTP/1.1 502 Bad Gateway\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (len(bomb), bomb),
    }
    with ScriptedServer(lambda conn, path: conn.sendall(answers[path.strip("/")])) as srv:
        queued = _queue(db, [f"http://127.0.0.1:{srv.port}/plain", f"http://127.0.0.1:{srv.port}/bomb"])
        Dispatcher(db, settings).run_once()
    with db.read() as s:
        logged = [(a.status_code, a.error) for a in s.scalars(select(DeliveryAttempt))]
        last = [d.last_error for d in s.scalars(select(WebhookDelivery))]
    assert sorted(code for code, _ in logged) == [500, 502] and len(queued) == 2
    for text in [e for _, e in logged] + last:
        assert "SECRET" not in text and "html" not in text
        assert "bytes" in text and len(text) < 200
