"""The chat-template diff is a real unified diff: `git apply` turns one text into the other, for any
pair (final newline or not, CRLF, lone CR, Unicode line separators, lines that look like diff syntax,
empty vs missing), and the TRL-bug pair of one-line templates is never glued together."""
from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import builders
from tests.fixtures.chat_templates import TRL_CUSTOM_TEMPLATE, TRL_DEFAULT_TEMPLATE
from trainer_hooks.fingerprint import diff_fingerprints
from trainer_hooks.fingerprint.cli import main
from trainer_hooks.fingerprint.core import assemble

NO_NEWLINE = "\\ No newline at end of file\n"


def template_diff(a, b) -> str:
    """The unified diff that diff_fingerprints shows for two chat_template values ("" when equal)."""
    result = diff_fingerprints(assemble("tokenizer", {"chat_template": a}, {}),
                               assemble("tokenizer", {"chat_template": b}, {}))
    rows = [c for c in result["components"] if c["name"] == "chat_template"]
    return rows[0]["detail"]["unified_diff"] if rows else ""

GIT = shutil.which("git")
needs_git = pytest.mark.skipif(GIT is None, reason="git is the reference patch applier")

# Fragments that break naive diffs: no final newline, CRLF, lone CR, \x0b and \u2028 (str.splitlines
# splits there), and text that looks like diff syntax.
FRAGMENTS = ["a", "b", "{% endif %}", "{% for message in messages %}", " ", "\n", "\n", "\r\n", "\r", "\x0b",
             "\u2028", "é", "--- x", "+++ y", "-", "+", "@@ -1 +1 @@", "\\ No newline at end of file", "\t"]


def _texts() -> st.SearchStrategy:
    return st.lists(st.sampled_from(FRAGMENTS), max_size=24).map("".join)


@st.composite
def _pairs(draw) -> tuple:
    """Two texts, often close to each other (as two versions of one template are)."""
    a = draw(st.one_of(st.none(), _texts()))
    if a is not None and draw(st.booleans()):
        pieces = list(a)
        for _ in range(draw(st.integers(1, 4))):
            at = draw(st.integers(0, len(pieces)))
            if pieces and draw(st.booleans()):
                del pieces[min(at, len(pieces) - 1)]
            else:
                pieces.insert(at, draw(st.sampled_from(FRAGMENTS)))
        return a, "".join(pieces)
    return a, draw(st.one_of(st.none(), _texts()))


def git_apply(workdir: Path, files: dict, patch: str) -> dict:
    """Apply ``patch`` with git to ``files`` ({relative path: text}) and return the files after."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    for rel, text in files.items():
        path = workdir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    if patch:
        (workdir.parent / "change.patch").write_bytes(patch.encode("utf-8"))
        subprocess.run([GIT, "apply", "--whitespace=nowarn", "--unsafe-paths", str(workdir.parent / "change.patch")],
                       cwd=workdir, check=True, capture_output=True, env={"GIT_CONFIG_NOSYSTEM": "1", "HOME": str(workdir)})
    return {str(p.relative_to(workdir)): p.read_bytes().decode("utf-8") for p in workdir.rglob("*") if p.is_file()}


def assert_well_formed(patch: str) -> None:
    """Every line of a hunk starts with ' ', '-', '+' or '\\': nothing glued onto another line."""
    in_header = True
    for line in patch.split("\n")[:-1]:
        if line.startswith("@@"):
            in_header = False
        elif in_header:
            assert line.startswith(("--- ", "+++ ")), line
        else:
            assert line[:1] in (" ", "-", "+", "\\"), line


@needs_git
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=_pairs())
def test_applying_the_diff_gives_the_other_text_back(tmp_path, pair):
    a, b = pair
    patch = template_diff(a, b)
    assert (patch == "") == ((a or "") == (b or ""))
    assert_well_formed(patch)
    before = {} if a is None else {"chat_template": a}
    after = git_apply(tmp_path / "tree", before, patch)
    assert after.get("chat_template", "") == (b or "")
    if a is not None and b is None and a:  # a removed template is a deleted file, as in git
        assert "chat_template" not in after


@needs_git
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=st.dictionaries(st.sampled_from(["default", "tool_use", "rag x/y"]), _texts(), max_size=3),
       b=st.dictionaries(st.sampled_from(["default", "tool_use", "rag x/y"]), _texts(), max_size=3))
def test_named_templates_diff_name_by_name(tmp_path, a, b):
    from urllib.parse import quote

    patch = template_diff(a or None, b or None)
    assert_well_formed(patch)
    path = lambda name: f"chat_template/{quote(name, safe='')}"  # noqa: E731
    after = git_apply(tmp_path / "tree", {path(k): v for k, v in a.items()}, patch)
    for name in set(a) | set(b):
        assert after.get(path(name), "") == b.get(name, "")


def test_the_trl_bug_pair_is_one_removed_line_and_one_added_line():
    patch = template_diff(TRL_CUSTOM_TEMPLATE, TRL_DEFAULT_TEMPLATE)
    assert patch == ("--- a/chat_template\n+++ b/chat_template\n@@ -1 +1 @@\n"
                     f"-{TRL_CUSTOM_TEMPLATE}\n{NO_NEWLINE}+{TRL_DEFAULT_TEMPLATE}\n{NO_NEWLINE}")


def test_crlf_and_final_newline_changes_are_visible():
    patch = template_diff("x\r\ny", "x\ny\n")
    assert "-x\r\n" in patch and "+x\n" in patch and "-y\n" + NO_NEWLINE in patch and patch.endswith("+y\n")
    assert template_diff("same", "same\n").count(NO_NEWLINE) == 1


def test_missing_and_empty_templates_are_told_apart(tmp_path, load, fp):
    empty = builders.build_chatml_tokenizer(tmp_path, name="empty", chat_template="")
    missing = builders.build_chatml_tokenizer(tmp_path, name="missing", chat_template=None)
    tok_empty, tok_missing = load(empty), load(missing)
    tok_empty.chat_template = ""  # saving drops an empty template: set it as a user would
    result = diff_fingerprints(fp(tok_empty), fp(tok_missing))
    row = next(c for c in result["components"] if c["name"] == "chat_template")
    assert row["severity"] == "error"
    assert row["summary"] == "b has no chat template (the other side's is empty)"
    assert (row["detail"]["a_present"], row["detail"]["b_present"]) == (True, False)
    assert row["detail"]["unified_diff"] == ""


def test_seeded_pairs_of_real_template_lines(tmp_path):
    """Hundreds more pairs built from the lines of real templates (a seeded generator, no shrinking)."""
    rng = random.Random(1234)
    lines = (TRL_CUSTOM_TEMPLATE + "\n" + TRL_DEFAULT_TEMPLATE).replace("%}", "%}\n").split("\n")
    for i in range(200):
        a = "\n".join(rng.choices(lines, k=rng.randint(0, 12))) + rng.choice(["", "\n", "\r\n"])
        b_lines = a.split("\n")
        for _ in range(rng.randint(1, 3)):
            b_lines.insert(rng.randint(0, len(b_lines)), rng.choice(lines))
            if len(b_lines) > 1 and rng.random() < 0.5:
                del b_lines[rng.randrange(len(b_lines))]
        b = "\n".join(b_lines)
        patch = template_diff(a, b)
        assert_well_formed(patch)
        if GIT and i % 4 == 0:  # git for a quarter of them: the generator is the point here
            assert git_apply(tmp_path / "tree", {"chat_template": a}, patch).get("chat_template", "") == b


def test_paritywatch_diff_prints_the_trl_pair_unglued(tmp_path, capsys):
    trainer = builders.build_chatml_tokenizer(tmp_path, name="trainer", chat_template=TRL_CUSTOM_TEMPLATE)
    rollout = builders.build_chatml_tokenizer(tmp_path, name="rollout", chat_template=TRL_DEFAULT_TEMPLATE)
    assert main(["diff", str(trainer), str(rollout)]) == 2
    out = capsys.readouterr().out
    section = out.split("--- chat_template ---\n", 1)[1].split("\n\n--- ", 1)[0]
    removed = [ln for ln in section.splitlines() if ln.startswith("-") and not ln.startswith("--- ")]
    added = [ln for ln in section.splitlines() if ln.startswith("+") and not ln.startswith("+++ ")]
    assert removed == ["-" + TRL_CUSTOM_TEMPLATE] and added == ["+" + TRL_DEFAULT_TEMPLATE]
    assert section.count("\\ No newline at end of file") == 2
