"""Imports inside backend/ point down the layers only (docs/design.md, "Components and what each
may import"). Every module is parsed with `ast`, imports inside functions included, so a lazy
import cannot hide an upward dependency."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Lowest first. Each entry is a folder of backend/ or a module at its top: the folder is the layer
# (a test below checks that no entry sits inside another). A module may import its own layer and
# the ones below. The same order is written in docs/design.md.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("trainer_hooks",),  # the client library and the wire contract: never imports backend
    ("paritywatch.backend.settings", "paritywatch.backend.errors", "paritywatch.backend.db", "paritywatch.backend.models",
     "paritywatch.backend.migrate"),
    ("paritywatch.backend.store",),  # all SQL
    ("paritywatch.backend.detect",),  # pure detection: rules and the fingerprint verdict
    ("paritywatch.backend.alerts", "paritywatch.backend.control", "paritywatch.backend.webhooks",
     "paritywatch.backend.auth"),  # alert lifecycle, run control, delivery, identities
    ("paritywatch.backend.background",),  # workers: detection engine and detectors, janitor, live streams
    ("paritywatch.backend.api", "paritywatch.backend.schemas", "paritywatch.backend.middleware"),  # HTTP
    ("paritywatch.backend.main", "paritywatch.backend.cli", "paritywatch.backend.serving",
     "paritywatch.backend.access_table"),  # the application and its tools
)


def layer_of(module: str) -> int | None:
    """Index in LAYERS of the longest prefix naming `module`; None outside backend/trainer_hooks."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for layer, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[0]:
                    best = (len(prefix), layer)
    return None if best is None else best[1]


def imported_modules(source: str, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`; `from pkg import sub` counts as
    `pkg.sub` so that importing a submodule through its package is seen."""
    package = module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def upward_imports(source: str, module: str) -> list[str]:
    own = layer_of(module)
    assert own is not None, f"{module} is in no layer: add it to LAYERS (and docs/design.md)"
    problems = []
    for line, target in imported_modules(source, module):
        target_layer = layer_of(target)
        if target_layer is not None and target_layer > own:
            problems.append(f"{module}:{line} imports {target} ({LAYERS[target_layer][0]} layer "
                            f"is above {LAYERS[own][0]})")
    return problems


def backend_modules() -> list[tuple[str, Path]]:
    # Installed as paritywatch.backend (docs/design.md, "Installed names").
    modules = [("paritywatch." + ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"), path)
               for path in sorted((ROOT / "backend").rglob("*.py"))]
    return [(module, path) for module, path in modules if module != "paritywatch.backend"]  # the package's docstring


def test_no_module_under_backend_imports_a_higher_layer() -> None:
    problems = [problem for module, path in backend_modules()
                for problem in upward_imports(path.read_text(), module)]
    assert not problems, "upward imports:\n" + "\n".join(problems)


def test_the_trainer_hooks_never_import_the_backend() -> None:
    problems = []
    for path in sorted((ROOT / "trainer_hooks").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        problems += [f"{module}:{line} imports {target}" for line, target in imported_modules(path.read_text(), module)
                     if target.split(".")[0] == "backend" or target.startswith("paritywatch.")]
    assert not problems, "\n".join(problems)


def test_the_check_sees_an_upward_import_even_inside_a_function() -> None:
    source = "def f():\n    from paritywatch.backend.detect.rules import BUILTIN_RULES\n"
    assert upward_imports(source, "paritywatch.backend.store.runs") == [
        "paritywatch.backend.store.runs:2 imports paritywatch.backend.detect.rules.BUILTIN_RULES "
        "(paritywatch.backend.detect layer is above paritywatch.backend.store)"]
    assert upward_imports("from paritywatch.backend.store import runs\n", "paritywatch.backend.detect.rules") == []
    assert upward_imports("from ..api import deps\n", "paritywatch.backend.store.runs")  # relative imports too


def test_each_layer_is_whole_folders_and_top_modules() -> None:
    """A folder's modules are all of one layer: no layer entry names a module or folder inside
    another entry's folder, so where a file lives says what it may import."""
    entries = [prefix for prefixes in LAYERS[1:] for prefix in prefixes]
    assert all(prefix.count(".") == 2 for prefix in entries), entries  # paritywatch.backend.<name>
    tops = {module.split(".")[2] for module, _ in backend_modules()}
    assert tops == {prefix.split(".")[2] for prefix in entries}, "a folder or top module of backend/ is in no layer"


def test_every_layer_in_the_test_is_written_in_the_design_document() -> None:
    design = (ROOT / "docs" / "design.md").read_text()
    missing = [prefix for prefixes in LAYERS for prefix in prefixes if f"`{prefix}`" not in design]
    assert not missing, f"docs/design.md does not name these layers: {missing}"


# The detectors (backend/background/detectors/) read and write through the store; the modules that
# decide what rows mean (parity, attest, audits, rules, trend, sawtooth, ...) take the rows as
# arguments and never reach a database themselves.
DATABASE_ACCESS = ("sqlalchemy", "paritywatch.backend.db")


def database_imports(source: str, module: str) -> list[str]:
    return [f"{module}:{line} imports {target}" for line, target in imported_modules(source, module)
            if any(target == home or target.startswith(home + ".") for home in DATABASE_ACCESS)]


def test_the_pure_detection_modules_reach_no_database() -> None:
    pure = [(module, path) for module, path in backend_modules()
            if layer_of(module) == layer_of("paritywatch.backend.detect")]
    assert {"paritywatch.backend.detect.parity", "paritywatch.backend.detect.attest",
            "paritywatch.backend.detect.audits", "paritywatch.backend.detect.rules"} <= {m for m, _ in pure}
    problems = [problem for module, path in pure for problem in database_imports(path.read_text(), module)]
    assert not problems, "a pure detection module reaches the database:\n" + "\n".join(problems)
    assert database_imports("from paritywatch.backend.db import Database\n", "paritywatch.backend.detect.parity")
    assert database_imports("def f():\n    from sqlalchemy.orm import Session\n", "paritywatch.backend.detect.rules")


# Where SQL may be written: the store, and the engine/session and schema modules under it.
SQL_HOMES = ("paritywatch.backend.store", "paritywatch.backend.db", "paritywatch.backend.migrate", "paritywatch.backend.models")
# Building a statement needs one of these; exceptions, sessions and URLs do not count.
SQL_BUILDERS = {"select", "update", "insert", "delete", "text", "func", "or_", "and_", "case", "exists", "literal"}


def sql_builders_used(source: str) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            found += [(node.lineno, alias.name) for alias in node.names if alias.name in SQL_BUILDERS]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name == "sqlalchemy"]
    return found


def test_sql_is_built_only_in_the_store() -> None:
    problems = [f"{module}:{line} imports {name} from sqlalchemy" for module, path in backend_modules()
                if not any(module == home or module.startswith(home + ".") for home in SQL_HOMES)
                for line, name in sql_builders_used(path.read_text())]
    assert not problems, "SQL outside backend/store/:\n" + "\n".join(problems)


def test_the_sql_check_sees_a_query_builder() -> None:
    assert sql_builders_used("from sqlalchemy import select, update\nfrom sqlalchemy.exc import IntegrityError\n") == [
        (1, "select"), (1, "update")]
    assert sql_builders_used("def f():\n    import sqlalchemy\n") == [(2, "sqlalchemy")]


def app_state_lookups(source: str) -> list[int]:
    """Lines that reach into `<something>.app.state`: a route takes services as typed dependencies."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr == "state"
            and isinstance(node.value, ast.Attribute) and node.value.attr == "app"]


def test_routes_take_services_as_typed_dependencies() -> None:
    problems = [f"{module}:{line}" for module, path in backend_modules() if module.startswith("paritywatch.backend.api.routes.")
                for line in app_state_lookups(path.read_text())]
    assert not problems, "request.app.state in routes (use a dependency from backend/api/deps.py):\n" + "\n".join(problems)
    assert app_state_lookups("def f(request):\n    return request.app.state.engine\n") == [2]
