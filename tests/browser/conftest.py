"""Browser-test fixtures: a real `paritywatch serve` on a free port with a temp SQLite DB, Debian's
headless Chromium driven by Playwright, and an artifacts folder for screenshots."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

from tests.support.live import free_port, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("PARITYWATCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"

# Records what the page itself cannot hide: CSP violations and uncaught errors.
WATCH_SCRIPT = """
window.__csp = []; window.__errors = [];
document.addEventListener('securitypolicyviolation', e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));
window.addEventListener('error', e => window.__errors.push(String(e.message)));
"""


class Server:
    """`paritywatch serve` as a subprocess (the same entry point a user runs)."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None):
        self.port = free_port()
        self.db_url = f"sqlite:///{workdir / 'browser.db'}"
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "server.log"
        exe = Path(sys.executable).with_name("paritywatch")
        cmd = [str(exe), "serve", "--db", self.db_url, "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log_path.open("w"), stderr=subprocess.STDOUT,
                                     env={**os.environ, **(env or {})})
        wait_healthy(self.url, 60, proc=self.proc, log_path=self.log_path)

    def token(self, scope: str, name: str) -> str:
        out = subprocess.run([str(Path(sys.executable).with_name("paritywatch")), "token", "create", "--db", self.db_url,
                              "--scope", scope, "--name", name, "--json"], capture_output=True, text=True, check=True)
        import json
        return json.loads(out.stdout.strip().splitlines()[-1])["token"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("server"))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")  # not session: Playwright's sync API keeps an event loop running
def browser():
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail(f"no Chromium at {CHROMIUM}: CI must install it (make system-deps)")
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def new_page(browser, width: int = 1400, height: int = 900):
    context = browser.new_context(viewport={"width": width, "height": height})
    context.add_init_script(WATCH_SCRIPT)
    page = context.new_page()
    page.set_default_timeout(45_000)  # generous: CI shares 2 cores with the server under test
    return page


@pytest.fixture
def page(browser):
    pg = new_page(browser)
    yield pg
    pg.context.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    return SCREENSHOTS


def page_problems(page) -> dict:
    return page.evaluate("({csp: window.__csp, errors: window.__errors})")


def drawn_chart(page, key: str):
    """The chart of `key` once drawn (it has buckets), scrolled into view as a reader would: a chart
    is fetched only near the viewport, and alerts that render above the charts push them down (the
    200k-point test waited for a chart it never scrolled to). If it is never drawn, fail saying what
    the chart and the page showed instead."""
    try:
        page.wait_for_function("""key => {
            const f = document.querySelector(`figure.chart[data-key="${key}"]`);
            if (f && f.dataset.buckets) return true;
            if (f) f.scrollIntoView({block: 'center'});
            return false; }""", arg=key, polling=100)
    except PlaywrightTimeoutError:
        shown = page.locator(f"figure.chart[data-key='{key}']").all_inner_texts()
        body = page.locator("main").first.inner_text()[:600] if page.locator("main").count() else ""
        raise AssertionError(f"chart {key!r} not drawn; the chart says {shown}, the page {body!r}, "
                             f"errors {page_problems(page)}") from None
    return page.locator(f"figure.chart[data-key='{key}'][data-buckets]")


def pump_until(page, predicate, timeout_s: float = 20.0, what: str = "condition"):
    """Poll `predicate` while Playwright runs the page's events (route handlers run only inside a
    Playwright call, so a plain sleep would never let them)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        page.wait_for_timeout(50)
    raise AssertionError(f"{what} not met within {timeout_s:g} s")


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    """A server that requires tokens: an admin and a read token, and one run ("token-run")."""
    import httpx

    from tests.browser.seed import Seeder
    from tests.support.live import wait_for

    srv = Server(tmp_path_factory.mktemp("token-server"))
    try:  # a setup that times out must not leave its server running
        tokens = {"admin": srv.token("admin", "ci-admin"), "read": srv.token("read", "viewer")}
        # open mode ends within its 2 s cache
        wait_for(lambda: httpx.get(f"{srv.url}/healthz").json()["open_mode"] is False, timeout_s=30)
        Seeder(srv.url, tokens["admin"]).run("token-run")
        yield srv, tokens
    finally:
        srv.stop()
