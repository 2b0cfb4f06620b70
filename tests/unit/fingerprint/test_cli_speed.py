"""`paritywatch diff` speed (issue 29, point 6): folder fingerprints cached on disk by content, and
tokenizer-only loads with torch hidden in a process the CLI owns. Neither may change a verdict."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, builders
from trainer_hooks.fingerprint import cli, folder_cache
from trainer_hooks.fingerprint.cli import load_fingerprint, main

# Runs the CLI the way the console script does (main() reading sys.argv), then says on stderr
# whether torch was hidden in that process.
_AS_COMMAND = ("import json, sys; from trainer_hooks.fingerprint.cli import main; sys.argv = ['paritywatch', *sys.argv[1:]]; "
               "rc = main(); print(json.dumps({'torch_hidden': sys.modules.get('torch', 0) is None}), file=sys.stderr); "
               "sys.exit(rc)")


def _as_command(*args: str) -> tuple[dict, dict]:
    out = subprocess.run([sys.executable, "-c", _AS_COMMAND, *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout), json.loads(out.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("folder", ["chatml", "qwen2", "llama3"])
def test_the_command_loads_tokenizers_without_torch_and_fingerprints_them_alike(folder, request, tmp_path):
    path = {"chatml": lambda: request.getfixturevalue("chatml_dir"),
            "qwen2": lambda: request.getfixturevalue("model_specific_dir"),  # config.json picks Qwen2Tokenizer
            "llama3": lambda: builders.build_llama3_tokenizer(tmp_path, builders.CUSTOM_TEMPLATE)}[folder]()
    from_command, process = _as_command("fingerprint", str(path), "--json", "--no-cache")
    assert process == {"torch_hidden": True}
    with_torch = load_fingerprint(str(path))  # this test process: torch importable, transformers with it
    assert from_command["digest"] == with_torch["digest"]
    assert from_command["env"]["class"] == with_torch["env"]["class"]


def test_torch_stays_for_processor_folders_and_code_that_calls_main(tmp_path, chatml_dir):
    (tmp_path / "mm").mkdir()
    (tmp_path / "mm" / "preprocessor_config.json").write_text("{}")
    probe = ("import sys; from trainer_hooks.fingerprint.cli import hide_torch_for_tokenizer_loads as hide; "
             "print(hide(sys.argv[1:], False))")
    answer = subprocess.run([sys.executable, "-c", probe, str(chatml_dir), str(tmp_path / "mm")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert answer.stdout.strip() == "False", answer.stderr
    answer = subprocess.run([sys.executable, "-c", probe.replace("False))", "True))"), str(tmp_path / "mm")],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert answer.stdout.strip() == "True", answer.stderr  # --tokenizer-only: no image processor loads
    main(["fingerprint", str(chatml_dir), "--no-cache"])  # called with argv: the caller's process
    assert sys.modules.get("torch") is not None


def _count_loads(monkeypatch) -> list:
    loads = []
    real = cli.load_processor

    def counting(*args, **kwargs):
        loads.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(cli, "load_processor", counting)
    return loads


def test_a_second_diff_of_unchanged_folders_loads_nothing_and_says_the_same(tmp_path, capsys, monkeypatch):
    a = builders.build_chatml_tokenizer(tmp_path, name="a")
    b = builders.build_chatml_tokenizer(tmp_path, name="b", chat_template=builders.CUSTOM_TEMPLATE)
    loads = _count_loads(monkeypatch)
    assert main(["diff", str(a), str(b), "--json"]) == 2
    first = capsys.readouterr().out
    assert len(loads) == 2
    assert main(["diff", str(a), str(b), "--json"]) == 2
    assert capsys.readouterr().out == first and len(loads) == 2  # both from the cache
    assert main(["diff", str(a), str(b), "--json", "--no-cache"]) == 2
    assert capsys.readouterr().out == first and len(loads) == 4


def test_the_key_is_the_content_and_the_options(tmp_path, capsys, monkeypatch):
    a = builders.build_chatml_tokenizer(tmp_path, name="a")
    b = builders.build_chatml_tokenizer(tmp_path, name="b")
    loads = _count_loads(monkeypatch)
    assert main(["diff", str(a), str(b), "--json"]) == 0
    assert len(loads) == 1  # b's files are a's: one load serves both
    (b / "chat_template.jinja").write_text(builders.CUSTOM_TEMPLATE)
    assert main(["diff", str(a), str(b), "--json"]) == 2  # an edited file is a new key, never a stale answer
    assert len(loads) == 2
    (b / "model.safetensors").write_bytes(b"\0" * 64)  # weights are not read by a tokenizer load
    assert main(["diff", str(a), str(b)]) == 2 and len(loads) == 2
    assert main(["diff", str(a), str(b), "--chat-template-kwargs", '{"enable_thinking": false}']) == 2
    assert len(loads) == 4  # other template variables: other renders
    assert main(["diff", str(a), str(b), "--trust-remote-code"]) == 2
    assert len(loads) == 6  # remote code may read beyond the folder: never cached
    capsys.readouterr()


def test_the_cache_can_be_turned_off_and_a_broken_entry_is_a_miss(tmp_path, monkeypatch, chatml_dir):
    monkeypatch.setenv(folder_cache.CACHE_ENV, "off")
    loads = _count_loads(monkeypatch)
    load_fingerprint(str(chatml_dir), use_cache=True)
    load_fingerprint(str(chatml_dir), use_cache=True)
    assert len(loads) == 2
    monkeypatch.setenv(folder_cache.CACHE_ENV, str(tmp_path / "cache"))
    fresh = load_fingerprint(str(chatml_dir), use_cache=True)
    [entry] = (tmp_path / "cache").glob("*.json")
    entry.write_text('{"truncated')
    assert load_fingerprint(str(chatml_dir), use_cache=True) == fresh and len(loads) == 4
