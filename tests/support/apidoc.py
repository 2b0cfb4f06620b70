"""Check docs/api.md against the app's OpenAPI schema: endpoints, query parameters, and the fields
of request and response bodies, both ways (missing from the doc, or documented but absent).

The doc stays hand-written prose; the checker reads only these conventions (docs/api.md says
them too, under "Keeping this reference true"):

- An endpoint's entry is a bullet that starts with its code span, `` - `GET /runs?project=&limit=` ``:
  the path exactly as the API has it (`/api/v1` left out; `/healthz` as is), its query string
  naming every query parameter. Other mentions of `` `METHOD /path` `` anywhere must exist.
- In the entry, the request body is the first `{...}` code span or fenced block before `→`, or a
  code span naming a shape; the answer is the first such after `→`.
- A shape is named by a line `` `Name`: `{"field": type, ...}` ``. Field values may be inline
  objects (`{...}`, `[{...}]`) or shape names (`Control`, `[Component]`); a field whose schema is an
  object with fields of its own must be written one of those ways. `"field"` alone (no value) is
  fine; `…` marks an open object (dict fields are not checked).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
PREFIX = "/api/v1"
_MENTION = re.compile(r"`(GET|POST|PUT|PATCH|DELETE) (/[^`?\s]*)(\?[^`]*)?`")
_ENTRY = re.compile(r"^\s*[-*] `(GET|POST|PUT|PATCH|DELETE) ")
_DEFINITION = re.compile(r"^[ \t]*(?:[-*][ \t]+)?`([A-Za-z][A-Za-z0-9]*)`:[ \t]*`([^`]*)`", re.M)
_SPAN = re.compile(r"```[a-z]*\n(.*?)```|`([^`]*)`", re.S)
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\],:|]|[^\s{}\[\],:|"]+')
OPEN_MARKS = {"…", "..."}


# ------------------------------------------------------------------ the doc
@dataclass
class Value:
    kind: str  # "object" | "list" | "ref" | "other"
    shape: "Shape | None" = None
    ref: str | None = None
    item: "Value | None" = None


@dataclass
class Shape:
    fields: dict[str, Value | None] = field(default_factory=dict)
    open: bool = False


def parse_shape(text: str) -> Shape | None:
    tokens = _TOKEN.findall(text)
    if not tokens or tokens[0] != "{":
        return None
    shape, _ = _object(tokens, 0)
    return shape


def _object(tokens: list[str], i: int) -> tuple[Shape, int]:
    shape, i = Shape(), i + 1
    while i < len(tokens) and tokens[i] != "}":
        tok = tokens[i]
        if tok == ",":
            i += 1
            continue
        if tok in OPEN_MARKS:
            shape.open, i = True, i + 1
            continue
        key = tok[1:-1] if tok.startswith('"') else None
        i += 1
        while i + 1 < len(tokens) and tokens[i] == "|":  # "token"|"name": alternatives of a key
            i += 2
        value = None
        if i < len(tokens) and tokens[i] == ":":
            value, i = _value(tokens, i + 1)
        else:
            i = _skip(tokens, i)
        if key is not None:
            shape.fields[key] = value
    return shape, i + 1


def _value(tokens: list[str], i: int) -> tuple[Value, int]:
    first = tokens[i] if i < len(tokens) else ""
    if first == "{":
        shape, i = _object(tokens, i)
        value = Value("object", shape=shape)
    elif first == "[":
        item = None
        if i + 1 < len(tokens) and tokens[i + 1] != "]":
            item, i = _value(tokens, i + 1)
        else:
            i += 1
        i = _skip(tokens, i)
        i += i < len(tokens) and tokens[i] == "]"
        value = Value("list", item=item)
    else:
        word = first.rstrip(".…?")
        value = Value("ref", ref=word) if re.fullmatch(r"[A-Z][A-Za-z0-9]*", word) else Value("other")
        i += 1
    return value, _skip(tokens, i)


def _skip(tokens: list[str], i: int) -> int:
    """Past the rest of a value ("a"|"b", int|null, …) to the `,` `}` or `]` that ends it."""
    depth = 0
    while i < len(tokens):
        tok = tokens[i]
        if depth == 0 and tok in (",", "}", "]"):
            break
        depth += tok in ("{", "[")
        depth -= tok in ("}", "]")
        i += 1
    return i


@dataclass
class Entry:
    method: str
    path: str
    query: set[str]
    line: int
    text: str  # the entry's whole bullet, continuation lines included


@dataclass
class Doc:
    entries: list[Entry]
    mentions: list[tuple[str, str, int]]  # (method, path, line)
    definitions: dict[str, tuple[str, int]]  # name -> (shape text, line)
    duplicates: list[tuple[str, int]] = field(default_factory=list)  # shapes defined again (name, line)


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def read_doc(text: str) -> Doc:
    lines = text.splitlines()
    entries = []
    for n, line in enumerate(lines):
        if not _ENTRY.match(line):
            continue
        block, indent = [line], len(line) - len(line.lstrip())
        for nxt in lines[n + 1:]:
            stripped = nxt.strip()
            if not stripped:
                block.append(nxt)
                continue
            lead = len(nxt) - len(nxt.lstrip())
            if lead <= indent and (stripped.startswith(("- ", "* ", "#", "|")) or not block[-1].strip()):
                break
            block.append(nxt)
        m = _MENTION.search(line)
        query = {q.split("=")[0] for q in (m.group(3) or "?")[1:].split("&") if q}
        entries.append(Entry(m.group(1), m.group(2), query, n + 1, "\n".join(block)))
    mentions = [(m.group(1), m.group(2), _line_of(text, m.start())) for m in _MENTION.finditer(text)]
    definitions: dict[str, tuple[str, int]] = {}
    duplicates = []
    for m in _DEFINITION.finditer(text):
        if m.group(1) in definitions:
            duplicates.append((m.group(1), _line_of(text, m.start())))
        definitions.setdefault(m.group(1), (m.group(2), _line_of(text, m.start())))
    return Doc(entries, mentions, definitions, duplicates)


def entry_shapes(entry: Entry, names: set[str]) -> tuple[str | None, str | None]:
    """(request shape text, answer shape text) of an entry: `{...}` spans or shape names."""
    first = _MENTION.search(entry.text)
    arrow = entry.text.find("→", first.end())
    request = answer = None
    for m in _SPAN.finditer(entry.text, first.end()):
        body = (m.group(1) if m.group(1) is not None else m.group(2)).strip()
        if not (body.startswith("{") or body.rstrip(".…") in names or
                (body.startswith("[") and body.strip("[].…") in names)):
            continue
        if arrow == -1 or m.start() < arrow:
            request = request or body
        else:
            answer = answer or body
            break
    return request, answer


# ------------------------------------------------------------------ the schema
class Schema:
    def __init__(self, openapi: dict):
        self.openapi = openapi
        self.components = openapi.get("components", {}).get("schemas", {})

    def resolve(self, s: dict | None) -> dict:
        seen = 0
        while s and "$ref" in s and seen < 20:
            s, seen = self.components[s["$ref"].rsplit("/", 1)[1]], seen + 1
        return s or {}

    def object_of(self, s: dict | None) -> tuple[str | None, dict | None]:
        """(schema name, schema) when `s` is (an optional / a list of) an object with fields."""
        for _ in range(5):
            if not s:
                return None, None
            if "anyOf" in s:
                s = next((x for x in s["anyOf"] if x.get("type") != "null"), None)
            elif s.get("type") == "array":
                s = s.get("items")
            else:
                break
        name = s["$ref"].rsplit("/", 1)[1] if s and "$ref" in s else (s or {}).get("title")
        s = self.resolve(s)
        return (name, s) if s.get("properties") else (None, None)

    def type_hint(self, s: dict) -> str:
        """A short type for skeleton suggestions: int, str, [Name], Name|null…"""
        if "$ref" in s:
            return s["$ref"].rsplit("/", 1)[1].removesuffix("Out")
        if "anyOf" in s:
            return "|".join(self.type_hint(x) for x in s["anyOf"])
        t = s.get("type")
        if t == "array":
            return f"[{self.type_hint(s.get('items', {}))}]"
        if "enum" in s:
            return "|".join(f'"{v}"' for v in s["enum"])
        return {"integer": "int", "string": "str", "number": "float", "boolean": "bool", "null": "null",
                "object": "{…}"}.get(t, "any")

    def skeleton(self, s: dict | None) -> str:
        s = self.resolve(s)
        props = s.get("properties", {})
        return "{" + ", ".join(f'"{k}": {self.type_hint(v)}' for k, v in props.items()) + "}"


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # as the doc writes it
    query: tuple[str, ...]
    request: dict | None
    answer: dict | None


def operations(openapi: dict) -> dict[tuple[str, str], Operation]:
    out = {}
    for path, ops in openapi["paths"].items():
        doc_path = path[len(PREFIX):] if path.startswith(PREFIX + "/") else path
        for method, op in ops.items():
            if method.upper() not in METHODS:
                continue
            query = tuple(p["name"] for p in op.get("parameters", []) if p["in"] == "query")
            request = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            answer = next((r.get("content", {}).get("application/json", {}).get("schema")
                           for code, r in sorted(op["responses"].items()) if code.startswith("2")), None)
            out[(method.upper(), doc_path)] = Operation(method.upper(), doc_path, query, request, answer)
    return out


# ------------------------------------------------------------------ the check
def check(doc_text: str, openapi: dict, other_routes: set[tuple[str, str]]) -> list[str]:
    """Problems, each saying exactly what to change in docs/api.md. `other_routes`: (method, path)
    of routes outside the OpenAPI schema that the doc may mention (e.g. GET /metrics)."""
    doc, schema = read_doc(doc_text), Schema(openapi)
    ops = operations(openapi)
    names = set(doc.definitions)
    used: set[str] = set()
    problems: list[str] = []

    for method, path, line in doc.mentions:
        if (method, path) not in ops and (method, path) not in other_routes:
            problems.append(f"line {line}: `{method} {path}` is documented but the API has no such endpoint: "
                            "remove it or fix the path (path parameters are named as in the API, e.g. {run_id})")
    by_op: dict[tuple[str, str], list[Entry]] = {}
    for e in doc.entries:
        by_op.setdefault((e.method, e.path), []).append(e)
    for key, op in sorted(ops.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        entries = by_op.get(key)
        if not entries:
            problems.append(_missing_endpoint(op, schema))
            continue
        if len(entries) > 1:
            problems.append(f"`{op.method} {op.path}` has {len(entries)} entries (lines "
                            f"{', '.join(str(e.line) for e in entries)}): keep one bullet starting with it")
        entry = entries[0]
        where = f"line {entry.line}, `{op.method} {op.path}`"
        for q in sorted(set(op.query) - entry.query):
            problems.append(f"{where}: query parameter `{q}` is not documented: add `{q}=` to the entry's query "
                            f"string, e.g. `{op.method} {op.path}?{'&'.join(p + '=' for p in op.query)}`")
        for q in sorted(entry.query - set(op.query)):
            problems.append(f"{where}: documents query parameter `{q}`, which the endpoint does not take: remove it")
        request, answer = entry_shapes(entry, names)
        for label, text, body in (("request body", request, op.request), ("answer", answer, op.answer)):
            name, obj = schema.object_of(body)
            if obj is None:
                continue
            if text is None:
                problems.append(f"{where}: its {label} ({name}) is not documented: write "
                                f"{'it before' if label == 'request body' else 'it after'} `→` as "
                                f"`{schema.skeleton(obj)}` or as the name of a shape line")
                continue
            _compare(_shape_of(text, doc, used), obj, f"{where}, {label} ({name})", schema, doc, used, problems, set())
    for name, line in doc.duplicates:
        problems.append(f"line {line}: shape `{name}` is defined again (first on line {doc.definitions[name][1]}): "
                        "keep one `Name`: `{{...}}` line per name")
    for name, (_, line) in sorted(doc.definitions.items()):
        if name not in used:
            problems.append(f"line {line}: shape `{name}` is not what any endpoint takes or answers: remove it, or "
                            "name it in an entry (after `→` for an answer)")
    return problems


def _missing_endpoint(op: Operation, schema: Schema) -> str:
    q = "?" + "&".join(p + "=" for p in op.query) if op.query else ""
    request = f" `{schema.skeleton(op.request)}`" if schema.object_of(op.request)[1] else ""
    name, obj = schema.object_of(op.answer)
    answer = f"`{name.removesuffix('Out')}`" if name and obj else ("204" if op.answer is None else "`{…}`")
    return (f"`{op.method} {op.path}` is not documented: add an entry to the section of its tag, e.g.\n"
            f"      - `{op.method} {op.path}{q}` (scope){request} → {answer}"
            + (f"\n    and a shape line `{name.removesuffix('Out')}`: `{schema.skeleton(obj)}` if the doc has none"
               if name and obj else ""))


def _shape_of(text: str, doc: Doc, used: set[str]) -> Shape | None:
    text = text.strip()
    if text.startswith("["):
        text = text.strip("[]").rstrip(".…").strip()
    if not text.startswith("{"):
        name = text.rstrip(".…")
        if name not in doc.definitions:
            return None
        used.add(name)
        text = doc.definitions[name][0]
    return parse_shape(text)


def _value_shape(value: Value | None, doc: Doc, used: set[str]) -> Shape | None:
    while value is not None and value.kind == "list":
        value = value.item
    if value is None:
        return None
    if value.kind == "object":
        return value.shape
    if value.kind == "ref" and value.ref in doc.definitions:
        used.add(value.ref)
        return parse_shape(doc.definitions[value.ref][0])
    return None


def _compare(shape: Shape | None, obj: dict, where: str, schema: Schema, doc: Doc, used: set[str],
             problems: list[str], seen: set[tuple[str, int]]) -> None:
    props = obj.get("properties", {})
    if shape is None:
        problems.append(f"{where}: cannot read its shape: write it as `{schema.skeleton(obj)}`")
        return
    for k in props:
        if k not in shape.fields:
            problems.append(f'{where}: field "{k}" ({schema.type_hint(props[k])}) is not documented: add it')
    if not shape.open:
        for k in shape.fields:
            if k not in props:
                problems.append(f'{where}: documents field "{k}", which the API does not have: remove it')
    for k, sub in props.items():
        name, sub_obj = schema.object_of(sub)
        if sub_obj is None or k not in shape.fields:
            continue
        key = (name or k, id(shape))
        if key in seen:
            continue
        inner = _value_shape(shape.fields[k], doc, used)
        if inner is None:
            problems.append(f'{where}: field "{k}" is an object ({name}): write its fields inline '
                            f'("{k}": {{...}}) or name a shape line ("{k}": {name.removesuffix("Out") if name else "Name"})')
            continue
        _compare(inner, sub_obj, f"{where}.{k}", schema, doc, used, problems, seen | {key})
