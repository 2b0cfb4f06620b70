"""``paritywatch fingerprint PATH`` and ``paritywatch diff A B``: the pre-flight check.

Run before launching a job, on the local directories the trainer and the rollout workers load.
Exit codes of ``diff``: 0 same/info, 1 warning, 2 error, 3 could not load an input.
Also runnable as ``python -m trainer_hooks.fingerprint.cli ...``.

Speed (docs/design.md §4, "The pre-flight CLI's speed"): a folder's fingerprint is cached on disk by content
(folder_cache.py), and a process the CLI owns loads tokenizer-only inputs with torch hidden.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from . import diff_fingerprints, fingerprint_processor, folder_cache
from .core import with_components
from .model_config import model_dir_components

EXIT_CODES = {"same": 0, "info": 0, "warning": 1, "error": 2}
EXIT_LOAD_FAILED = 3

PATH_HELP = ("a local model or tokenizer directory (tokenizer.json / tokenizer_config.json, "
             "a processor with preprocessor_config.json, or a Mistral tekken.json; its config.json and "
             "adapter_config.json are read too), a .gguf file, "
             "a tekken*.json file, or a fingerprint JSON file written by `fingerprint --json`")


def add_fingerprint_commands(subparsers: Any) -> None:
    """Add the ``fingerprint`` and ``diff`` subcommands to an argparse subparsers object."""
    fp = subparsers.add_parser(
        "fingerprint", help="fingerprint a local tokenizer or processor",
        description="Load PATH offline the way transformers / mistral-common would, and print one "
                    "digest per component (vocab, chat_template, special tokens, behavior probes...).",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    fp.add_argument("path", metavar="PATH", help=PATH_HELP)
    fp.add_argument("--json", action="store_true", help="print the full fingerprint as JSON (the wire format)")
    _add_load_options(fp)
    fp.set_defaults(func=run_fingerprint)

    df = subparsers.add_parser(
        "diff", help="compare two tokenizers/processors before launching a job",
        description="Fingerprint A and B and say whether they tokenize alike and, for model directories, whether "
                    "their config.json / adapter_config.json compute the same logits.\n"
                    "Exit codes: 0 same or info, 1 warning, 2 error, 3 an input could not be loaded.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    df.add_argument("a", metavar="A", help="the trainer side: " + PATH_HELP)
    df.add_argument("b", metavar="B", help="the rollout side, same forms as A")
    df.add_argument("--json", action="store_true",
                    help='print {"verdict": ..., "components": [{"name", "severity", "summary", "detail"}]}')
    _add_load_options(df)
    df.set_defaults(func=run_diff)


def _add_load_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow custom tokenizer code shipped in the directory (off by default)")
    parser.add_argument("--tokenizer-only", action="store_true",
                        help="load only the tokenizer even where a multimodal processor exists")
    parser.add_argument("--no-cache", action="store_true",
                        help=f"load PATH even when the fingerprint cache holds it (${folder_cache.CACHE_ENV}: "
                             "the cache directory, or off)")
    parser.add_argument("--chat-template-kwargs", type=_json_object, default=None, metavar="JSON",
                        help='the template variables the run renders prompts with, e.g. \'{"enable_thinking": false}\': '
                             "every chat probe is rendered with them")


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


# --------------------------------------------------------------------------- loading

def load_fingerprint(path: str, trust_remote_code: bool = False, tokenizer_only: bool = False,
                     chat_template_kwargs: Any = None, *, use_cache: bool = False) -> dict:
    """Fingerprint what PATH names, offline; generation_config.json next to it is read too.
    ``use_cache``: read and write the on-disk cache (folder_cache.py); the result is plain JSON
    either way, as it would travel."""
    p = Path(path)
    saved = _saved_fingerprint(p)
    if saved is not None:
        return saved
    # The model's own files (config.json, adapter_config.json) are read as JSON, never cached.
    model, env = model_dir_components(p) if p.is_dir() else ({}, {})
    if model and not _has_processor(p):  # a model (or adapter) directory without a tokenizer
        return with_components(None, model, env)
    options = {"trust_remote_code": trust_remote_code, "tokenizer_only": tokenizer_only,
               "chat_template_kwargs": chat_template_kwargs}
    key = folder_cache.cache_key(p, options) if use_cache else None
    fp = folder_cache.load(key) if key else None
    if fp is None:
        proc = load_processor(p, trust_remote_code, tokenizer_only)
        fp = fingerprint_processor(proc, model_dir=p if p.is_dir() else p.parent,
                                   chat_template_kwargs=chat_template_kwargs)
        fp = json.loads(json.dumps(fp, ensure_ascii=False))  # what a cache hit returns, key order kept
        if key:
            folder_cache.store(key, fp)
    return with_components(fp, model, env) if model else fp


def _saved_fingerprint(p: Path) -> dict | None:
    """A fingerprint JSON file written by `fingerprint --json`, or None when PATH is not one."""
    if p.is_file() and p.suffix == ".json" and not p.name.startswith("tekken"):
        data = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "fingerprint_version" in data:
            return data
    return None


def hide_torch_for_tokenizer_loads(paths: list[str], tokenizer_only: bool) -> bool:
    """Make torch look uninstalled before transformers is imported, when every input loads as a
    tokenizer (or needs no load). transformers then skips its model stack (torch alone takes
    seconds to import) and a tokenizer loads, encodes and renders exactly as with it
    (tests/unit/fingerprint/test_cli_speed.py compares the fingerprints). A processor folder keeps
    torch: its image processor's class depends on torch/torchvision. Only for a process the CLI
    owns (``main()`` reading sys.argv): the choice holds for the whole process. True when hidden."""
    if "torch" in sys.modules or "transformers" in sys.modules:
        return False
    if not all(_loads_as_tokenizer(Path(p), tokenizer_only) for p in paths):
        return False
    sys.modules["torch"] = None  # importlib.util.find_spec("torch") now answers None
    logging.getLogger("transformers").addFilter(_NoTorchNotice())
    return True


class _NoTorchNotice(logging.Filter):
    """transformers announces "PyTorch was not found..." on import: true here, and not news."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("PyTorch was not found")


def _loads_as_tokenizer(p: Path, tokenizer_only: bool) -> bool:
    if p.suffix == ".gguf":
        return False  # transformers' GGUF conversion: not measured without torch, left as it was
    if not p.is_dir() or tokenizer_only:
        return True
    return not any((p / f).exists() for f in PROCESSOR_FILES)


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def _has_processor(p: Path) -> bool:
    return any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tekken.json", "tokenizer.model",
                                          "vocab.json", "preprocessor_config.json", "processor_config.json"))


def load_processor(p: Path, trust_remote_code: bool = False, tokenizer_only: bool = False) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a pre-flight check never downloads
    tekken = _tekken_file(p)
    if tekken is not None:
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
        return MistralTokenizer.from_file(str(tekken))
    from transformers import AutoProcessor, AutoTokenizer

    if p.is_file() and p.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(p.parent, gguf_file=p.name)
    if not p.is_dir():
        raise FileNotFoundError(f"{p} is not a directory, a .gguf or a tekken .json file")
    kwargs = {"local_files_only": True, "trust_remote_code": trust_remote_code}
    if not tokenizer_only and any((p / f).exists() for f in PROCESSOR_FILES):
        return AutoProcessor.from_pretrained(p, **kwargs)
    return AutoTokenizer.from_pretrained(p, **kwargs)


def _tekken_file(p: Path) -> Any:
    if p.is_file() and p.suffix == ".json" and p.name.startswith("tekken"):
        return p
    if p.is_dir() and (p / "tekken.json").exists() and not (p / "tokenizer_config.json").exists():
        return p / "tekken.json"
    return None


# --------------------------------------------------------------------------- commands

def run_fingerprint(args: argparse.Namespace) -> int:
    _prepare_process(args, [args.path])
    try:
        fp = load_fingerprint(args.path, args.trust_remote_code, args.tokenizer_only, args.chat_template_kwargs,
                              use_cache=not args.no_cache)
    except Exception as exc:
        print(f"paritywatch: cannot load {args.path}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_LOAD_FAILED
    print(json.dumps(fp, ensure_ascii=False) if args.json else format_fingerprint(fp))
    return 0


def run_diff(args: argparse.Namespace) -> int:
    _prepare_process(args, [args.a, args.b])
    fps = []
    for path in (args.a, args.b):
        try:
            fps.append(load_fingerprint(path, args.trust_remote_code, args.tokenizer_only,
                                        args.chat_template_kwargs, use_cache=not args.no_cache))
        except Exception as exc:
            print(f"paritywatch: cannot load {path}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_LOAD_FAILED
    result = diff_fingerprints(*fps)
    print(json.dumps(result, ensure_ascii=False) if args.json else format_diff(result, args.a, args.b))
    return EXIT_CODES[result["verdict"]]


def _prepare_process(args: argparse.Namespace, paths: list[str]) -> None:
    if getattr(args, "own_process", False):
        hide_torch_for_tokenizer_loads(paths, args.tokenizer_only)


def format_fingerprint(fp: dict) -> str:
    lines = [f"kind {fp['kind']}   fingerprint_version {fp['fingerprint_version']}   digest {fp['digest']}", ""]
    lines.append(f"{'component':<18} {'digest':<16} summary")
    for name, comp in fp["components"].items():
        lines.append(f"{name:<18} {comp['digest'][:16]:<16} {_summarise(name, comp['value'])}")
    return "\n".join(lines)


def _summarise(name: str, value: Any) -> str:
    if value is None:
        return "(none)"
    if name in ("vocab", "merges", "added_tokens"):
        return f"{len(value)} entries"
    if name == "chat_template":
        return f"{len(value)} chars" if isinstance(value, str) else f"named: {', '.join(sorted(value))}"
    if name == "behavior":
        return f"{len(value.get('encode', []))} probe texts, {len(value.get('chat') or {})} chat renders"
    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 90 else text[:87] + "..."


def format_diff(result: dict, a: str, b: str) -> str:
    lines = [f"a: {a}", f"b: {b}", f"verdict: {result['verdict'].upper()}"]
    if not result["components"]:
        lines.append("the two processors tokenize alike")
    for row in result["components"]:
        lines.append(f"  [{row['severity']:<7}] {row['name']:<18} {row['summary']}")
    for cause in result.get("causes") or []:
        lines.append(f"  likely cause: {cause['summary']}")
    for row in result["components"]:
        detail = _format_detail(row)
        if detail:
            lines += ["", f"--- {row['name']} ---", detail]
    return "\n".join(lines)


def _format_detail(row: dict) -> str:
    detail = row.get("detail") or {}
    if "unified_diff" in detail:
        return detail["unified_diff"].rstrip("\n") or _no_template_text(detail)
    if row["name"] == "behavior" and "sample" in detail:
        return _format_behavior(detail)
    rows = detail.get("rows") or detail.get("sample")
    if rows:
        more = max(0, detail.get("differing", len(rows)) - 20)
        return "\n".join([_row_text(r) for r in rows[:20]] + ([f"  ... and {more} more"] if more else []))
    if "a" in detail or "b" in detail:
        return f"a: {_json(detail.get('a'))}\nb: {_json(detail.get('b'))}"
    return ""


def _no_template_text(detail: dict) -> str:
    missing = [side for side in ("a", "b") if detail.get(f"{side}_present") is False]
    return f"({' and '.join(missing) or 'neither side'} has no template; the other's is empty)"


def _format_behavior(detail: dict) -> str:
    lines = []
    for r in detail["sample"]:
        lines.append(f"  {r['part']} {r['probe']}")
        for side in ("a", "b"):
            if (r.get("error") or {}).get(side):
                lines.append(f"    {side} raised {r['error'][side]}")
        text = r.get("text") or {}
        if text.get("a") is not None and text.get("a") == text.get("b"):
            lines.append(f"    text (same on both sides): {excerpt(text['a'], None)}")
        elif text.get("a") is not None or text.get("b") is not None:
            at = r.get("first_diff_char")
            lines += [f"    {side}: {excerpt(text.get(side), at)}" for side in ("a", "b")]
        tokens = r.get("tokens")
        if tokens:
            after = f", after {_json(tokens['before'])}" if tokens.get("before") else ""
            lines.append(f"    at token {tokens['at']}{after}: {token_change(tokens)}")
        if not (tokens or text or r.get("error")):
            lines += [f"    {side}: {_json(r.get(side))[:100]}" for side in ("a", "b")]
    shown = {(r["part"], r["probe"]) for r in detail["sample"]}
    rest = [f"{part} {label}" for part, labels in (detail.get("differing_probes") or {}).items()
            for label in labels if (part, label) not in shown]
    if rest:
        lines.append(f"  ... and {len(rest)} more: " + ", ".join(rest[:12]) + (", …" if len(rest) > 12 else ""))
    if any(r.get("first_diff_char") is not None for r in detail["sample"]):
        lines.append("  (⟦ marks the first difference)")
    return "\n".join(lines)


def token_change(tokens: dict) -> str:
    """``"\\n\\n" → ["\\n", "\\n"] vs ["\\n\\n"]``: the text both runs spell, then each side's tokens."""
    change = f"{_json(tokens['a'])} vs {_json(tokens['b'])}"
    return f"{_json(tokens['span'])} → {change}" if tokens.get("span") is not None else change


def excerpt(text: Any, at: Any, before: int = 50, after: int = 40) -> str:
    """The text around its first difference, JSON-escaped so newlines and spaces show."""
    if text is None:
        return "(none)"
    if at is None:
        return _json(text[:before + after]) + ("…" if len(text) > before + after else "")
    start = max(0, at - before)
    body = _json(text[start:at]) [:-1] + "⟦" + _json(text[at:at + after])[1:]
    return ("…" if start else "") + body + ("…" if at + after < len(text) else "")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _row_text(r: dict) -> str:
    label = r.get("token", r.get("key", r.get("id", r.get("rank", r.get("probe")))))
    a, b = (json.dumps(r.get(k), ensure_ascii=False) for k in ("a", "b"))
    return f"  {label!s:<24} a={a[:100]}  b={b[:100]}"


def main(argv: Any = None) -> int:
    """``argv`` None: this is the command line, and the process is the CLI's (see
    hide_torch_for_tokenizer_loads); a list: called from other code, which keeps its imports."""
    parser = argparse.ArgumentParser(prog="paritywatch", description="Paritywatch processor fingerprints")
    add_fingerprint_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    args.own_process = argv is None
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
