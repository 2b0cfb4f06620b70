"""Regenerate docs/img/workers-view.png: the run page's workers view with 512 processes.

    .venv/bin/python scripts/screenshot_workers.py [--out docs/img/workers-view.png]

Starts `paritywatch serve` on a temporary SQLite file, seeds a run over the HTTP API
(tests/browser/workers_seed.py: a trainer, 511 rollout workers, one lagging, one with another
processor, one closed; real tokenizer fingerprints from the test fixtures, so the diff link opens
a real diff) and screenshots the workers section in Debian's headless Chromium.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, Server  # noqa: E402
from tests.browser.seed import processor_fingerprints  # noqa: E402
from tests.browser.workers_seed import METRIC, seed_workers_run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img" / "workers-view.png")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        good, bad = processor_fingerprints(work)
        server = Server(work)
        try:
            seeded = seed_workers_run(server.url, "grpo-qwen7b-async", good_fp=good, bad_fp=bad)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                page.goto(f"{server.url}/#/runs/{seeded.run_id}")
                section = page.locator("#workers")
                section.locator("tr.worker-row").first.wait_for(timeout=60_000)
                page.add_style_tag(content=".topbar, .controls { position: static; }")  # sticky bars would cover the section
                section.locator(".worker-series").scroll_into_view_if_needed()
                page.locator(".worker-series[data-workers]").wait_for(timeout=60_000)
                page.locator(".worker-plot .main-svg").first.wait_for(timeout=60_000)
                section.scroll_into_view_if_needed()
                args.out.parent.mkdir(parents=True, exist_ok=True)
                section.screenshot(path=str(args.out))
                browser.close()
        finally:
            server.stop()
    print(f"wrote {args.out} ({METRIC} per worker below the table)")


if __name__ == "__main__":
    main()
