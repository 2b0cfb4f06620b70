"""``paritywatch fingerprint PATH`` and ``paritywatch diff A B``: the pre-flight check.

Run before launching a job, on the local directories the trainer and the rollout workers load.
Exit codes of ``diff``: 0 same/info, 1 warning, 2 error, 3 could not load an input.
Also runnable as ``python -m trainer_hooks.fingerprint.cli ...``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from . import diff_fingerprints, fingerprint_processor

EXIT_CODES = {"same": 0, "info": 0, "warning": 1, "error": 2}
EXIT_LOAD_FAILED = 3

PATH_HELP = ("a local model or tokenizer directory (tokenizer.json / tokenizer_config.json, "
             "a processor with preprocessor_config.json, or a Mistral tekken.json), a .gguf file, "
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
        description="Fingerprint A and B and say whether they tokenize alike.\n"
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


# --------------------------------------------------------------------------- loading

def load_fingerprint(path: str, trust_remote_code: bool = False, tokenizer_only: bool = False) -> dict:
    """Fingerprint what PATH names, offline; generation_config.json next to it is read too."""
    p = Path(path)
    if p.is_file() and p.suffix == ".json" and not p.name.startswith("tekken"):
        data = json.loads(p.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "fingerprint_version" in data:
            return data
    proc = load_processor(p, trust_remote_code, tokenizer_only)
    return fingerprint_processor(proc, model_dir=p if p.is_dir() else p.parent)


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
    if not tokenizer_only and any((p / f).exists() for f in ("preprocessor_config.json", "processor_config.json")):
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
    try:
        fp = load_fingerprint(args.path, args.trust_remote_code, args.tokenizer_only)
    except Exception as exc:
        print(f"paritywatch: cannot load {args.path}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_LOAD_FAILED
    print(json.dumps(fp, ensure_ascii=False) if args.json else format_fingerprint(fp))
    return 0


def run_diff(args: argparse.Namespace) -> int:
    fps = []
    for path in (args.a, args.b):
        try:
            fps.append(load_fingerprint(path, args.trust_remote_code, args.tokenizer_only))
        except Exception as exc:
            print(f"paritywatch: cannot load {path}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_LOAD_FAILED
    result = diff_fingerprints(*fps)
    print(json.dumps(result, ensure_ascii=False) if args.json else format_diff(result, args.a, args.b))
    return EXIT_CODES[result["verdict"]]


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
    for row in result["components"]:
        detail = _format_detail(row)
        if detail:
            lines += ["", f"--- {row['name']} ---", detail]
    return "\n".join(lines)


def _format_detail(row: dict) -> str:
    detail = row.get("detail") or {}
    if "unified_diff" in detail:
        return detail["unified_diff"].rstrip("\n") or "(one side has no template)"
    rows = detail.get("rows") or detail.get("sample")
    if rows:
        more = max(0, detail.get("differing", len(rows)) - 20)
        return "\n".join([_row_text(r) for r in rows[:20]] + ([f"  ... and {more} more"] if more else []))
    if "a" in detail or "b" in detail:
        return f"a: {json.dumps(detail.get('a'), ensure_ascii=False)}\nb: {json.dumps(detail.get('b'), ensure_ascii=False)}"
    return ""


def _row_text(r: dict) -> str:
    label = r.get("token", r.get("key", r.get("id", r.get("rank", r.get("probe")))))
    a, b = (json.dumps(r.get(k), ensure_ascii=False) for k in ("a", "b"))
    return f"  {label!s:<24} a={a[:100]}  b={b[:100]}"


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="paritywatch", description="Paritywatch processor fingerprints")
    add_fingerprint_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
