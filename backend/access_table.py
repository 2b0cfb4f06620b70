"""The route x scope table of docs/api.md, generated from the app's own scope declarations.

    python -m paritywatch.backend.access_table            # print it
    python -m paritywatch.backend.access_table --write    # replace it in docs/api.md
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from paritywatch.backend.api.deps import route_access_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
START, END = "<!-- access-table:start -->", "<!-- access-table:end -->"
HIDDEN = ("/api/{rest:path}",)  # the 404/405 fallback for unknown API paths
# Vendored assets carry their package's version in the URL (immutable caching): the table names
# the pattern, so it does not go stale when a package is upgraded.
VERSIONED = ((re.compile(r"/vendor/plotly-[^/]+\.min\.js"), "/vendor/plotly-{version}.min.js"),
             (re.compile(r"/vendor/swagger-ui-[^/]+/"), "/vendor/swagger-ui-{version}/"))


def documented_path(path: str) -> str:
    for pattern, generic in VERSIONED:
        path = pattern.sub(generic, path)
    return path


def _mib(field: str) -> str:
    from paritywatch.backend.settings import Settings

    return f"{Settings.model_fields[field].default / 2**20:g} MiB"


def markdown(app) -> str:
    large, small = _mib("max_body_bytes"), _mib("max_small_body_bytes")
    rows = ["| method | path | who | body cap (default) |", "| --- | --- | --- | --- |"]
    seen = set()
    for entry in route_access_table(app):
        path = documented_path(entry.path)
        if entry.method == "HEAD" or path in HIDDEN or (entry.method, path) in seen:
            continue
        seen.add((entry.method, path))
        body = "" if entry.method in ("GET", "DELETE") else (large if entry.access.large_body else small)
        rows.append(f"| {entry.method} | `{path}` | {entry.access.describe()} | {body} |")
    return "\n".join(rows)


def replace_in(doc: str, table: str) -> str:
    before, rest = doc.split(START, 1)
    _, after = rest.split(END, 1)
    return f"{before}{START}\n{table}\n{END}{after}"


def _app():
    import tempfile

    from paritywatch.backend.main import create_app
    from paritywatch.backend.settings import Settings

    scratch = Path(tempfile.mkdtemp()) / "routes.db"  # never opened: the app is only inspected
    return create_app(Settings(database_url=f"sqlite:///{scratch}", run_background_workers=False),
                      upgrade_schema=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help=f"update {DOC.name} in place")
    args = ap.parse_args(argv)
    table = markdown(_app())
    if args.write:
        DOC.write_text(replace_in(DOC.read_text(), table))
    else:
        print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
