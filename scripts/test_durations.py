"""Refresh tests/durations.json (seconds per test file) from a JUnit XML report of a whole-suite run.

    .venv/bin/python -m pytest -n 4 --dist loadfile --junitxml=/tmp/suite.xml
    .venv/bin/python scripts/test_durations.py /tmp/suite.xml

tests/conftest.py hands the files to the parallel workers longest first from these figures: with
whole files per worker (--dist loadfile), a long file left for the end runs alone while the other
workers idle. The figures only order the files; a stale or missing one costs time, never a result.
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "durations.json"


def file_of(case: ET.Element) -> str:
    """tests/e2e/test_demo.py from classname "tests.e2e.test_demo" (or "...test_demo.TestX")."""
    parts = case.get("classname", "").split(".")
    while parts and not parts[-1].startswith("test_"):
        parts.pop()  # a test class's name
    return "/".join(parts) + ".py"


def main(report: str) -> int:
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        seconds[file_of(case)] += float(case.get("time", 0))
    ranked = dict(sorted(((f, round(s, 1)) for f, s in seconds.items()), key=lambda kv: -kv[1]))
    OUT.write_text(json.dumps(ranked, indent=1) + "\n")
    print(f"{OUT}: {len(ranked)} files, {sum(ranked.values()):.0f} s in all; longest: "
          + ", ".join(f"{f} {s:.0f} s" for f, s in list(ranked.items())[:3]))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
