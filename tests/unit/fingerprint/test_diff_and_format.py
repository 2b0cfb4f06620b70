"""The diff is pure, JSON-stable and never raises; the package imports with the stdlib only."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, builders
from trainer_hooks.fingerprint import FINGERPRINT_VERSION, diff_fingerprints
from trainer_hooks.fingerprint.canonical import canonical_json, digest
from trainer_hooks.fingerprint.core import assemble

COMPONENTS = {"vocab", "merges", "model_params", "normalizer", "pre_tokenizer", "post_processor", "decoder",
              "added_tokens", "special_tokens", "encode_flags", "chat_template", "runtime", "behavior"}


def test_canonical_json_is_sorted_compact_and_unicode():
    assert canonical_json({"b": 1, "a": [1.5, "é"], "c": {3, 1}}) == '{"a":[1.5,"é"],"b":1,"c":[1,3]}'
    assert digest({"x": 1, "y": 2}) == digest(json.loads('{"y": 2, "x": 1}'))


def test_import_needs_only_the_stdlib():
    code = ("import sys, trainer_hooks.fingerprint as f; f.diff_fingerprints({}, {});"
            "print(sorted(m for m in ('transformers','torch','tokenizers','mistral_common','numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_wire_format(chatml_dir, load, fp):
    f = fp(load(chatml_dir))
    assert f["fingerprint_version"] == FINGERPRINT_VERSION == 1
    assert f["kind"] == "tokenizer" and set(f["components"]) == COMPONENTS
    for comp in f["components"].values():
        assert comp["digest"] == digest(comp["value"])
    assert f["digest"] == digest({n: c["digest"] for n, c in f["components"].items()})
    assert str(chatml_dir) not in json.dumps(f["components"])  # paths never in compared parts


def test_digest_is_stable_across_processes(chatml_dir, fp, load):
    code = ("import sys; sys.path.insert(0, %r); from tests.fixtures.tokenizers import quiet_transformers;"
            "quiet_transformers(); from transformers import AutoTokenizer;"
            "from trainer_hooks.fingerprint import fingerprint_processor as f;"
            "print(f(AutoTokenizer.from_pretrained(%r))['digest'])") % (str(ROOT), str(chatml_dir))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == fp(load(chatml_dir))["digest"]


@pytest.mark.parametrize("bad", [None, {}, {"fingerprint_version": 99, "components": {}},
                                 {"fingerprint_version": 1, "components": {"vocab": "x"}},
                                 {"fingerprint_version": 1}, "not a dict"])
def test_malformed_or_foreign_version_is_an_error_not_an_exception(bad):
    good = assemble("tokenizer", {"vocab": [[0, "a"]]}, {})
    for a, b in ((bad, good), (good, bad)):
        result = diff_fingerprints(a, b)
        assert result["verdict"] == "error"
        assert [c["name"] for c in result["components"]] == ["fingerprint_version"]


def test_broken_values_still_give_a_verdict():
    a = assemble("tokenizer", {"vocab": [[0, "a"]], "behavior": {"encode": [[1]]}}, {})
    b = assemble("tokenizer", {"vocab": [[0, "b"]], "behavior": {"encode": [[1]]}}, {})
    b["components"]["vocab"]["value"] = "garbage"  # a detail cannot be built from this
    result = diff_fingerprints(a, b)
    assert (result["verdict"], result["components"][0]["name"]) == ("error", "vocab")


def test_behavior_values_that_share_no_probe_are_an_error_not_a_pass():
    a = assemble("tokenizer", {"behavior": {"encode": [[1]], "chat": None}}, {})
    for garbage in ("garbage", {}, {"encode": "x"}):
        b = assemble("tokenizer", {"behavior": garbage}, {})
        result = diff_fingerprints(a, b)
        assert (result["verdict"], result["components"][0]["name"]) == ("error", "behavior"), garbage


def _fp(**values):
    base = {"behavior": {"encode": [[1, 2]]}, "decoder": {"type": "ByteLevel"}, "runtime": {"padding_side": "right"}}
    return assemble("tokenizer", {**base, **values}, {"class": "X"})


def test_structure_with_same_behavior_is_warning_and_with_other_behavior_is_error():
    warn = diff_fingerprints(_fp(), _fp(decoder={"type": "Sequence", "decoders": [{"type": "ByteLevel"}, {"type": "Fuse"}]}))
    assert (warn["verdict"], warn["components"][0]["name"]) == ("warning", "decoder")
    err = diff_fingerprints(_fp(), _fp(decoder={"type": "Metaspace"}, behavior={"encode": [[3]]}))
    assert err["verdict"] == "error"
    assert {c["name"]: c["severity"] for c in err["components"]} == {"behavior": "error", "decoder": "error"}


def test_runtime_only_is_info_and_env_is_never_compared():
    a, b = _fp(), _fp(runtime={"padding_side": "left"})
    b["env"] = {"class": "Other", "transformers_version": "4.0"}
    result = diff_fingerprints(a, b)
    assert (result["verdict"], [c["name"] for c in result["components"]]) == ("info", ["runtime"])


def test_component_reported_by_one_side_only_is_info():
    a, b = _fp(), _fp()
    del b["components"]["decoder"]
    assert diff_fingerprints(a, b)["verdict"] == "info"


def test_diff_survives_json_round_trip_and_is_json(tmp_path, load, fp):
    a = fp(load(builders.build_chatml_tokenizer(tmp_path, name="a")))
    b = fp(load(builders.build_chatml_tokenizer(tmp_path, name="b", chat_template=builders.CUSTOM_TEMPLATE)))
    result = diff_fingerprints(json.loads(json.dumps(a)), json.loads(json.dumps(b)))
    assert json.loads(json.dumps(result)) == result
    assert result == diff_fingerprints(a, b)


def test_tekken_byte_zero_token_is_stored_as_a_symbol_the_backend_accepts(fp):
    """Tekken's token 1000 is the byte 0: a NUL the backend refuses (PostgreSQL cannot store it)."""
    from paritywatch.backend.middleware import json_body_problem

    tekken = builders.load_tekken()
    assert tekken.instruct_tokenizer.tokenizer.vocab()[1000] == "\x00"
    fingerprint = fp(tekken)
    assert dict(fingerprint["components"]["vocab"]["value"])[1000] == "\u2400"
    assert json_body_problem(json.dumps(fingerprint).encode()) is None
    assert json_body_problem(json.dumps({"token": "\x00"}).encode()) is not None  # what it used to send
