"""Every error code the backend can send is in the wire contract (trainer_hooks/contract.py), so a
client that reacts to codes knows each one the server may answer with."""
from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import paritywatch.backend
from paritywatch.backend.errors import ParitywatchError
from trainer_hooks import contract

BACKEND = Path(paritywatch.backend.__file__).resolve().parent
# Functions whose argument named `code` (or the positional one at this index) is an error code.
CODE_ARGUMENT = {"error_response": 2, "error_envelope": 2}


def all_subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub} | all_subclasses(sub)
    return found


def literal_codes(source: str) -> list[tuple[int, str]]:
    """(line, code) of string literals the source uses as error codes: class attributes `code`,
    `code=` keywords, and the code argument of the envelope builders."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if (isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "code" for t in stmt.targets)
                        and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):
                    found.append((stmt.lineno, stmt.value.value))
        elif isinstance(node, ast.Call):
            values = [k.value for k in node.keywords if k.arg == "code"]
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            if name in CODE_ARGUMENT and len(node.args) > CODE_ARGUMENT[name]:
                values.append(node.args[CODE_ARGUMENT[name]])
            found += [(v.lineno, v.value) for v in values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return found


def test_every_domain_error_class_has_a_contract_code() -> None:
    for info in pkgutil.walk_packages([str(BACKEND)], "paritywatch.backend."):
        importlib.import_module(info.name)  # so that every error class defined anywhere is seen
    classes = all_subclasses(ParitywatchError) | {ParitywatchError}
    assert len(classes) >= 7  # the store's, the stream hub's and the fingerprint check's
    unknown = {f"{c.__module__}.{c.__qualname__}": c.code for c in classes if c.code not in contract.ERROR_CODES}
    assert not unknown, f"error codes missing from trainer_hooks/contract.py: {unknown}"


def test_no_error_code_literal_in_the_backend_is_outside_the_contract() -> None:
    unknown = [f"{path.relative_to(BACKEND.parent)}:{line} {code!r}"
               for path in sorted(BACKEND.rglob("*.py"))
               for line, code in literal_codes(path.read_text()) if code not in contract.ERROR_CODES]
    assert not unknown, "error codes missing from trainer_hooks/contract.py:\n" + "\n".join(unknown)


def test_the_scan_sees_each_way_of_naming_a_code() -> None:
    source = ('class Gone(NotFound):\n    code = "gone_forever"\n'
              'error_response(410, "gone", "gone_too")\n'
              'error_response(410, "gone", code="gone_three")\n')
    assert literal_codes(source) == [(2, "gone_forever"), (3, "gone_too"), (4, "gone_three")]


def test_every_status_the_server_names_has_a_code_and_the_envelope_uses_it(client) -> None:
    for status, code in contract.ERROR_CODE_FOR_STATUS.items():
        assert contract.error_envelope(status, "m")["error"] == {"status": status, "code": code, "message": "m"}
    assert contract.error_envelope(418, "m")["error"]["code"] == contract.ERROR_OTHER
    answer = client.get("/api/v1/runs/999999")
    assert answer.status_code == 404
    assert contract.error_code_and_message(answer.json()) == (contract.ERROR_NOT_FOUND, "run 999999 does not exist")
