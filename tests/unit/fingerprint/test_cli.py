"""`paritywatch fingerprint` / `paritywatch diff`: tables, JSON and exit codes."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from conftest import ROOT, builders
from trainer_hooks.fingerprint.cli import add_fingerprint_commands, main


def test_diff_same_exits_0_with_json(chatml_dir, tmp_path, capsys):
    other = builders.build_chatml_tokenizer(tmp_path, name="other")
    assert main(["diff", str(chatml_dir), str(other), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"verdict": "same", "components": []}


def test_diff_template_mismatch_exits_2_and_shows_unified_diff(tmp_path, capsys):
    a = builders.build_chatml_tokenizer(tmp_path, name="a")
    b = builders.build_chatml_tokenizer(tmp_path, name="b", chat_template=builders.CUSTOM_TEMPLATE)
    assert main(["diff", str(a), str(b)]) == 2
    out = capsys.readouterr().out
    assert "verdict: ERROR" in out and "chat_template" in out and "--- a/chat_template" in out
    assert main(["diff", str(a), str(b), "--json"]) == 2
    result = json.loads(capsys.readouterr().out)
    assert {"chat_template", "behavior"} <= {c["name"] for c in result["components"]}


def test_diff_warning_exits_1(tmp_path, capsys):
    a = builders.build_chatml_tokenizer(tmp_path, name="a", generation_config={"eos_token_id": 2, "top_p": 0.9})
    b = builders.build_chatml_tokenizer(tmp_path, name="b", generation_config={"eos_token_id": 2, "top_p": 0.95})
    assert main(["diff", str(a), str(b), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "warning"


def test_fingerprint_json_can_be_diffed_later(chatml_dir, tmp_path, capsys):
    assert main(["fingerprint", str(chatml_dir), "--json"]) == 0
    saved = tmp_path / "fp.json"
    saved.write_text(capsys.readouterr().out)
    assert json.loads(saved.read_text())["fingerprint_version"] == 1
    assert main(["diff", str(saved), str(chatml_dir), "--json"]) == 0


def test_fingerprint_table_and_tekken_file(capsys):
    assert main(["fingerprint", str(builders.tekken_file())]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kind mistral") and "vocab" in out and "131072 entries" in out


def test_unloadable_path_exits_3(tmp_path, capsys):
    assert main(["diff", str(tmp_path / "missing"), str(tmp_path)]) == 3
    assert "cannot load" in capsys.readouterr().err


def test_subcommands_plug_into_any_parser_with_help():
    parser = argparse.ArgumentParser(prog="paritywatch")
    add_fingerprint_commands(parser.add_subparsers(dest="command"))
    help_text = parser._subparsers._group_actions[0].choices["diff"].format_help()
    assert "Exit codes: 0 same or info, 1 warning, 2 error" in help_text


def test_python_dash_m_entry_point(chatml_dir):
    out = subprocess.run([sys.executable, "-m", "trainer_hooks.fingerprint.cli", "fingerprint", str(chatml_dir)],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and "chat_template" in out.stdout
