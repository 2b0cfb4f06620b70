"""Dashboard first paint: a run with 10 series of 1M points each; the run page's first chart painted
in < 1.5 s (median), measured in the browser (Debian's headless Chromium through Playwright).

    .venv/bin/python bench/dashboard.py [--quick]

Seeding: directly into a fresh SQLite file through paritywatch.backend.store.metrics.MetricStore.ingest (the same
code the POST /metrics route runs, minus HTTP and JSON: 10M points over HTTP take minutes on 2 cores).
Measurement: `paritywatch serve` on that file; each sample opens the run page in a fresh browser
context (cold cache: plotly.js, modules and data all fetched; `plotly_js` in the JSON says which
bundle the server serves, the partial one `make install` fetches or the full fallback) and reads the page's own
performance mark `paritywatch:first-chart-painted` (set one animation frame after Plotly drew the
first chart), i.e. milliseconds since navigation start. Warm samples reload in the same context.

Workers view (issue 16): a second run with 512 registered processes (1 trainer, 511 rollout workers
with versions, throughput, two fingerprint groups, one lagging; seeded over the HTTP API by
tests/browser/workers_seed.py). Each sample opens its run page in a fresh context and reads
`paritywatch:workers-rendered` (one animation frame after the table was drawn), since navigation
start and since the run page created the view (`paritywatch:workers-view-start`; its first page was
fetched in parallel with the run, so this is the view's own share), then filters it in the page:
text ("rollout-31": 10 rows), state (closed: 1 row), back to all 512, timing each from the change
to the next frame after the table was redrawn. Target: rendered and every filter < 1 s (median).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, Server  # noqa: E402
from tests.browser.workers_seed import seed_workers_run  # noqa: E402

TARGET_MS = 1500.0
WORKERS_TARGET_MS = 1000.0
WORKERS = 512
SERIES = 10
BATCH_POINTS = 100_000


# When the run page drew its first chart (the page marks it: frontend/static/charts.js), or null.
FIRST_CHART_PAINTED_MS = ("() => { const m = performance.getEntriesByName('paritywatch:first-chart-painted'); "
                          "return m.length ? m[0].startTime : null; }")

def progress(msg: str) -> None:
    print(f"[dashboard] {msg}", file=sys.stderr, flush=True)


def seed(db_url: str, points: int) -> int:
    from paritywatch.backend import migrate
    from paritywatch.backend.db import Database
    from paritywatch.backend.detect.rules import BUILTIN_RULES
    from paritywatch.backend.store.metrics import MetricStore, prepare_batch
    from paritywatch.backend.store.runs import create_or_get_run

    migrate.upgrade(db_url)
    db = Database(db_url)
    with db.write() as s:
        run = create_or_get_run(s, "bench-10x1M", "bench", {}, {}, default_rules=BUILTIN_RULES)
    store = MetricStore(db)
    keys = ["align/kl_k3", "align/prob_abs_diff_mean", "align/is_ratio_mean", "align/logprob_abs_diff_max",
            "loss", "reward/mean", "reward/std", "rollout/staleness_mean", "grad_norm", "lr"][:SERIES]
    steps_per_batch = BATCH_POINTS // len(keys)
    client, seq, started = uuid.uuid4().hex, 0, time.perf_counter()
    for lo in range(0, points, steps_per_batch):
        steps = list(range(lo, min(points, lo + steps_per_batch)))
        series = {k: [math.sin(s / 5000 + i) + 0.1 * math.sin(s / 3) for s in steps] for i, k in enumerate(keys)}
        seq += 1
        store.ingest(run.id, client, seq, prepare_batch(steps, series, BATCH_POINTS, 200))
        if seq % 10 == 0:
            done = min(points, lo + steps_per_batch) * len(keys)
            progress(f"seeded {done:,} / {points * len(keys):,} points ({done / (time.perf_counter() - started):,.0f}/s)")
    db.dispose()
    return run.id


def first_paint_ms(page, url: str) -> tuple[float, int]:
    page.goto(url)
    page.locator("figure.chart[data-buckets]").first.wait_for(timeout=30_000)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ms = page.evaluate(FIRST_CHART_PAINTED_MS)
        if ms is not None:
            buckets = int(page.locator("figure.chart[data-buckets]").first.get_attribute("data-buckets"))
            return float(ms), buckets
        time.sleep(0.02)
    raise RuntimeError("the first-chart mark never appeared")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="100k points a series, 3 samples (the workers run keeps 512 processes)")
    ap.add_argument("--samples", type=int, default=None)
    args = ap.parse_args()
    points = 100_000 if args.quick else 1_000_000
    samples = args.samples or (3 if args.quick else 7)

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        db_url = f"sqlite:///{work / 'browser.db'}"
        progress(f"seeding {SERIES} series x {points:,} points into {db_url}")
        t0 = time.perf_counter()
        run_id = seed(db_url, points)
        seed_s = time.perf_counter() - t0
        server = Server(work)
        try:
            import httpx

            # which plotly.js the page loads: the partial bundle (make install) or the full fallback
            plotly_url = httpx.get(f"{server.url}/api/v1/ui-config").json()["plotly_url"]
            plotly_bytes = len(httpx.get(server.url + plotly_url, headers={"Accept-Encoding": "gzip"}).content)
            progress(f"plotly.js: {plotly_url}")
            url = f"{server.url}/#/runs/{run_id}"
            cold, warm, buckets = [], [], 0
            progress(f"seeding a run with {WORKERS} processes over HTTP")
            t0 = time.perf_counter()
            workers_url = f"{server.url}/#/runs/{seed_workers_run(server.url, 'bench-512-workers', WORKERS - 1).run_id}"
            workers_seed_s = time.perf_counter() - t0
            workers = {"render": [], "view": [], "filter": []}
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                first_paint_ms(browser.new_page(), url)  # server warm-up (imports, SQLite page cache)
                for i in range(samples):
                    context = browser.new_context(viewport={"width": 1400, "height": 900})
                    page = context.new_page()
                    ms, buckets = first_paint_ms(page, url)
                    cold.append(ms)
                    page.reload()
                    warm.append(_reload_ms(page))
                    progress(f"sample {i + 1}/{samples}: cold {ms:.0f} ms, warm {warm[-1]:.0f} ms ({buckets} buckets)")
                    context.close()
                workers_view_ms(browser.new_page(), workers_url)  # warm-up, as above
                for i in range(samples):
                    context = browser.new_context(viewport={"width": 1400, "height": 900})
                    sample = workers_view_ms(context.new_page(), workers_url)
                    for name, value in sample.items():
                        workers[name].append(value)
                    progress(f"workers sample {i + 1}/{samples}: rendered {sample['render']:.0f} ms after navigation "
                             f"({sample['view']:.0f} ms in the view), slowest filter {sample['filter']:.0f} ms")
                    context.close()
                browser.close()
        finally:
            server.stop()
    median = statistics.median(cold)
    workers_median = {name: statistics.median(values) for name, values in workers.items()}
    met_workers = workers_median["render"] < WORKERS_TARGET_MS and workers_median["filter"] < WORKERS_TARGET_MS
    print(json.dumps({
        "bench": "dashboard", "series": SERIES, "points_per_series": points, "seeding": "MetricStore.ingest (direct)",
        "seed_s": round(seed_s, 1), "first_chart_buckets": buckets,
        "plotly_js": plotly_url, "plotly_js_bytes": plotly_bytes,
        "first_chart_ms_median": round(median, 1), "first_chart_ms_cold": [round(x) for x in cold],
        "first_chart_ms_warm_median": round(statistics.median(warm), 1),
        "first_chart_ms_warm": [round(x) for x in warm],
        "target": f"< {TARGET_MS:.0f} ms median", "met_cold": median < TARGET_MS,
        "met_warm": statistics.median(warm) < TARGET_MS, "met_first_chart": median < TARGET_MS,
        "workers": WORKERS, "workers_seed_s": round(workers_seed_s, 1),
        "workers_rendered_ms_median": round(workers_median["render"], 1),
        "workers_rendered_ms": [round(x) for x in workers["render"]],
        "workers_view_ms_median": round(workers_median["view"], 1),
        "workers_filter_ms_median": round(workers_median["filter"], 1),
        "workers_filter_ms": [round(x) for x in workers["filter"]],
        "workers_target": f"rendered (since navigation) and each filter < {WORKERS_TARGET_MS:.0f} ms median",
        "met_workers": met_workers, "met": median < TARGET_MS and met_workers,
    }))


# Filters the workers table the way a person does (an input or change event on its control) and
# resolves one frame after the redraw; returns [ms, rows shown].
_FILTER_JS = """
async ([selector, value]) => {
  const input = document.querySelector(`#workers ${selector}`);
  const t0 = performance.now();
  input.value = value;
  input.dispatchEvent(new Event(input.tagName === 'SELECT' ? 'change' : 'input'));
  await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 0)));
  return [performance.now() - t0, Number(document.querySelector('#workers .workers-scroll').dataset.shown)];
}
"""
_FILTERS = (("input[data-filter=text]", "rollout-31", 10), ("input[data-filter=text]", "", WORKERS),
            ("select[data-filter=state]", "closed", 1), ("select[data-filter=state]", "", WORKERS))


def workers_view_ms(page, url: str) -> dict[str, float]:
    """{"render": ms since navigation start until the table was drawn, "view": ms of that since the
    run page created the view, "filter": the slowest of _FILTERS}."""
    page.goto(url)
    page.locator(f"#workers .workers-scroll[data-shown='{WORKERS}']").wait_for(timeout=60_000)
    deadline = time.monotonic() + 10
    marks = None
    while time.monotonic() < deadline and marks is None:
        marks = page.evaluate("""() => {
          const done = performance.getEntriesByName('paritywatch:workers-rendered');
          const start = performance.getEntriesByName('paritywatch:workers-view-start');
          return done.length ? [done[0].startTime, done[0].startTime - start[0].startTime] : null; }""")
        if marks is None:
            time.sleep(0.02)
    if marks is None:
        raise RuntimeError("the workers-rendered mark never appeared")
    slowest = 0.0
    for selector, value, rows in _FILTERS:
        ms, shown = page.evaluate(_FILTER_JS, [selector, value])
        if shown != rows:
            raise RuntimeError(f"filter {selector}={value!r} showed {shown} rows, not {rows}")
        slowest = max(slowest, ms)
    return {"render": float(marks[0]), "view": float(marks[1]), "filter": slowest}


def _reload_ms(page) -> float:
    page.locator("figure.chart[data-buckets]").first.wait_for(timeout=30_000)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        ms = page.evaluate(FIRST_CHART_PAINTED_MS)
        if ms is not None:
            return float(ms)
        time.sleep(0.02)
    raise RuntimeError("the first-chart mark never appeared after reload")


if __name__ == "__main__":
    main()
