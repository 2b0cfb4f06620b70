"""Regenerate the README's dashboard screenshots of the compare view and the parity panel.

    .venv/bin/python scripts/dashboard_screenshots.py            # writes docs/img/compare-runs.png, parity-panel.png

Starts `paritywatch serve` on a temporary SQLite database, seeds two runs of one project through the
HTTP API (last night's healthy run, and tonight's with a rollout worker that loads the model's default
chat template instead of the trainer's custom one: the TRL bug), and photographs them in Debian's
headless Chromium (the browser tests' fixtures; needs the `test` extras and /usr/bin/chromium).
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, Server  # noqa: E402
from tests.browser.seed import Seeder, chatml_fingerprint, spread_arrivals, wave  # noqa: E402
from tests.fixtures.chat_templates import TRL_CUSTOM_TEMPLATE, TRL_DEFAULT_TEMPLATE  # noqa: E402

STEPS = 1200
BATCH_STEPS = 50
JOIN_STEP = 700  # tonight: the worker with the default processor joins here


def seed_run(s: Seeder, name: str, trainer_fp: dict, rollout_fps: list[dict], drift_from: int | None) -> dict:
    run = s.run(name, project="grpo-qwen7b-math", model="Qwen2.5-7B")
    trainer = s.component(run["id"], "trainer", "trainer-rank0")
    s.fingerprint(run["id"], trainer["id"], trainer_fp)
    for i, fp in enumerate(rollout_fps):
        worker = s.component(run["id"], "rollout", f"vllm-{i:02d}", host=f"node-{1 + i // 2}")
        s.fingerprint(run["id"], worker["id"], fp)
    drifted = lambda x: drift_from is not None and x >= drift_from  # noqa: E731
    noise = wave(STEPS, 0.3 if drift_from is None else 1.1)
    for first in range(0, STEPS, BATCH_STEPS):
        xs = list(range(first, first + BATCH_STEPS))
        s.metrics(run["id"], xs, {
            "loss": [0.25 + 0.9 * math.exp(-x / 300) + 0.03 * noise[x] + (0.18 if drifted(x) else 0.0) for x in xs],
            "reward/mean": [0.15 + 0.6 * (1 - math.exp(-x / 350)) - (0.12 if drifted(x) else 0.0) for x in xs],
            "align/prompt_rerender_mismatch_frac": [0.25 if drifted(x) else 0.0 for x in xs],
        })
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="pw-screens-"))
    custom = chatml_fingerprint(work, TRL_CUSTOM_TEMPLATE, "custom")
    default = chatml_fingerprint(work, TRL_DEFAULT_TEMPLATE, "default")
    server = Server(work)
    try:
        s = Seeder(server.url)
        nightly = seed_run(s, "nightly-healthy", custom, [custom] * 3, None)
        tonight = seed_run(s, "tonight", custom, [custom] * 3 + [default], JOIN_STEP)
        spread_arrivals(server.db_url, nightly["id"], 9)
        spread_arrivals(server.db_url, tonight["id"], 7)
        args.out.mkdir(parents=True, exist_ok=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.set_default_timeout(60_000)
            page.goto(f"{server.url}/#/compare?runs={nightly['id']},{tonight['id']}&metric=loss")
            page.wait_for_function("() => { const p = document.querySelector('[data-compare=plot]');"
                                   " return p && p.data && p.data.length === 2; }")
            page.screenshot(path=str(args.out / "compare-runs.png"), full_page=True)
            page.goto(f"{server.url}/#/runs/{tonight['id']}")
            page.locator("#parity details.probe-preview[open] tr[data-probe]").wait_for()
            page.locator("#parity").screenshot(path=str(args.out / "parity-panel.png"))
            browser.close()
    finally:
        server.stop()
    print(f"wrote {args.out / 'compare-runs.png'} and {args.out / 'parity-panel.png'}")


if __name__ == "__main__":
    main()
