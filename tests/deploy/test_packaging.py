"""The installed distribution: the server's folders under one `paritywatch` namespace (no generic
top-level `backend`, `migrations` or `demo` in site-packages), and a wheel that works on its own:
the server finds its dashboard files and its migrations next to its package."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("paritywatch-*.whl")
    return wheel


def test_wheel_installs_only_the_paritywatch_namespace_and_the_client_library(tmp_path) -> None:
    wheel = build_wheel(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"paritywatch", "trainer_hooks"}, top_level
    assert "paritywatch/frontend/index.html" in names
    assert any(n.startswith("paritywatch/migrations/versions/0001_") for n in names)

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    # The installed copy, not this checkout: migrate a database and find the dashboard from `target`.
    probe = f"""
import sys
sys.path.insert(0, {str(target)!r})
import paritywatch.backend.main as main
from paritywatch.backend import migrate
assert main.__file__.startswith({str(target)!r}), main.__file__
assert (main.FRONTEND_DIR / "index.html").is_file(), main.FRONTEND_DIR
migrate.upgrade("sqlite:///" + {str(tmp_path / "installed.db")!r})
print("ok", migrate.MIGRATIONS_DIR)
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert str(target) in done.stdout


def test_code_imports_the_server_by_its_installed_name() -> None:
    """`backend`, `migrations` and `demo` exist only as `paritywatch.*` once installed: a bare import
    works in this checkout by accident (the repository root on sys.path) and fails installed."""
    import re

    bare = re.compile(r"^\s*(from|import)\s+(backend|migrations|demo)\b", re.M)
    offenders = [str(p.relative_to(ROOT)) for folder in ("backend", "migrations", "demo", "trainer_hooks", "tests",
                                                          "bench", "examples", "scripts")
                 for p in (ROOT / folder).rglob("*.py") if bare.search(p.read_text())]
    assert not offenders, f"bare imports (use paritywatch.<name>): {offenders}"
