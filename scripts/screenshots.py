"""Regenerate the README's screenshots of the demo's run page (docs/img/demo-*.png).

    .venv/bin/python scripts/screenshots.py [--out docs/img]

Runs `paritywatch demo` in a temporary folder (its own backend, SQLite) until it has told its
story (its JSON line: the run is paused), photographs the live run page in Debian's Chromium
(Playwright): the paused run with its banner, the training curves and the alignment metric that
jumps where the wrong worker joined; then stops the demo (SIGTERM).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PARITYWATCH = str(Path(sys.executable).with_name("paritywatch"))
CHROMIUM = os.environ.get("PARITYWATCH_CHROMIUM", "/usr/bin/chromium")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_demo(folder: Path) -> tuple[subprocess.Popen, dict]:
    """The demo, left running (dashboard up) once it printed its summary."""
    cmd = [PARITYWATCH, "demo", "--port", str(free_port()), "--model-dir", str(folder / "model")]
    demo = subprocess.Popen(cmd, cwd=folder, stdout=subprocess.PIPE, text=True)
    for line in demo.stdout:
        if line.startswith("{"):
            return demo, json.loads(line)
    raise SystemExit(f"the demo exited ({demo.wait()}) before its story was told")


def photograph(url: str, run_id: int, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    shots = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
        page.set_default_timeout(60_000)
        page.goto(f"{url}/#/runs/{run_id}")
        page.locator("[data-banner=mismatch]").wait_for()
        for key in ("align/prompt_rerender_mismatch_frac", "loss"):  # charts are drawn when scrolled into view
            fig = page.locator(f"figure.chart[data-key='{key}']")
            fig.scroll_into_view_if_needed()
            fig.locator(".js-plotly-plot .annotation").first.wait_for()
        page.evaluate("window.scrollTo(0, 0)")
        shots.append(out / "demo-run.png")
        page.screenshot(path=shots[-1])
        # The top bar and the run's controls stick to the top of the window: not over a chart's picture.
        unstuck = ".topbar, .controls { position: static !important; }"
        shots.append(out / "demo-charts.png")
        page.locator("details.chart-group[data-group=training]").screenshot(path=shots[-1], style=unstuck)
        shots.append(out / "demo-align.png")
        page.locator("figure.chart[data-key='align/prompt_rerender_mismatch_frac']").screenshot(path=shots[-1], style=unstuck)
        browser.close()
    return shots


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        demo, summary = start_demo(Path(tmp))
        try:
            print(json.dumps(summary), file=sys.stderr)
            if summary["run_state"] != "paused":
                raise SystemExit(f"the demo did not tell its story: {summary}")
            url = summary["dashboard"].split("/#/")[0]
            for shot in photograph(url, summary["run_id"], out):
                print(shot)
        finally:
            demo.send_signal(signal.SIGTERM)  # the demo ends its processes and its backend
            demo.wait(timeout=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
