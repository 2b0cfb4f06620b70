"""Weight attestation on the hooks' side: what a digest covers (trainer_hooks/attest.py), and
`ParityMonitor.attest_weights` / `attest_stream` against the real backend, never raising."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.hooks.conftest import Backend
from trainer_hooks.attest import AttestOptions, WeightsDigest, digest_weights, sample_offsets, tensor_bytes
from trainer_hooks.monitor import ParityMonitor


def digests(weights, version: int = 1, **opts) -> dict[str, str]:
    return {e["name"]: e["digest"] for e in digest_weights(weights, version, AttestOptions(**opts))["tensors"]}


def state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed": torch.randn(300, 64, generator=g), "norm": torch.randn(64, generator=g).to(torch.bfloat16),
            "scalar": torch.tensor(2.5)}


def test_a_digest_is_over_dtype_shape_and_bytes_not_storage_or_threads():
    base = digests(state())
    assert digests({k: v.clone() for k, v in state().items()}, threads=1, block_bytes=4096) != base  # block size is a setting
    assert digests({k: v.clone() for k, v in state().items()}, threads=1) == base
    w = state()
    w["embed"] = w["embed"].t().contiguous().t()  # same values, column-major storage
    assert not w["embed"].is_contiguous() and digests(w) == base
    w = state()
    w["embed"] = w["embed"].reshape(64, 300)  # same bytes, another shape
    assert digests(w)["embed"] != base["embed"]
    w = state()
    w["norm"] = w["norm"].to(torch.float16)  # another dtype
    assert digests(w)["norm"] != base["norm"]
    assert digests({"x": np.arange(12, dtype=np.float32)}) == digests({"x": torch.arange(12, dtype=torch.float32)})


def test_one_changed_value_changes_only_its_tensor():
    w = state()
    w["embed"] = w["embed"].clone()
    w["embed"][299, 63] = torch.nextafter(w["embed"][299, 63], torch.tensor(1e9))  # one ulp, the last element
    changed = {k for k, v in digests(w).items() if v != digests(state())[k]}
    assert changed == {"embed"}


def test_cpu_tensors_are_read_in_place():
    t = torch.randn(1000).to(torch.bfloat16)
    view = tensor_bytes("t", t).read(0, 16)
    assert np.asarray(view).__array_interface__["data"][0] == t.data_ptr()


def test_sampled_mode_reads_the_same_offsets_on_both_sides_and_others_per_version():
    tb = tensor_bytes("embed", torch.zeros(1 << 16))
    first = sample_offsets(tb, 7, 1024, 8)
    assert first == sample_offsets(tensor_bytes("embed", torch.ones(1 << 16)), 7, 1024, 8)
    assert first[0] == 0 and first[-1] == tb.nbytes - 1024
    assert sample_offsets(tb, 8, 1024, 8) != first
    assert sample_offsets(tensor_bytes("embed", torch.zeros(100)), 7, 1024, 8) is None  # small: whole
    payload = digest_weights(state(), 7, AttestOptions(mode="sampled", chunk_bytes=256, chunks=4))
    assert payload["mode"] == "sampled" and payload["sample"] == {"chunk_bytes": 256, "chunks": 4}
    assert payload["bytes_hashed"] < payload["bytes_total"]


def test_sampled_mode_finds_a_change_inside_a_sampled_chunk():
    w = state()
    opts = dict(mode="sampled", chunk_bytes=256, chunks=4)
    off = sample_offsets(tensor_bytes("embed", w["embed"]), 3, 256, 4)[1]
    w["embed"] = w["embed"].clone()
    w["embed"].view(-1)[off // 4 + 1] += 1.0
    assert digests(w, 3, **opts)["embed"] != digests(state(), 3, **opts)["embed"]


def test_streamed_digests_equal_the_whole():
    stream = WeightsDigest(4)
    for name, t in state().items():
        stream.add([(name, t)])
    assert stream.result()["digest"] == digest_weights(state(), 4)["digest"]
    with pytest.raises(ValueError):
        digest_weights([("a", torch.zeros(1)), ("a", torch.zeros(1))], 1)


def test_attestations_reach_the_backend_and_never_raise(backend: Backend, spool_dir: Path):
    with ParityMonitor("attest-hooks", side="trainer", url=backend.url, spool_dir=spool_dir) as monitor:
        summary = monitor.attest_weights(torch.nn.Linear(8, 4), version=3)
        assert summary["tensor_count"] == 2 and summary["version"] == 3 and "tensors" not in summary
        sent = list(monitor.attest_stream(state().items(), version=4))
        assert [name for name, _ in sent] == list(state())
        assert monitor.attest_weights(object(), version=5) is None  # not weights: counted, not raised
        assert monitor.attest_weights(state(), version=-1) is None
        assert list(monitor.attest_stream([("a", object()), ("b", torch.zeros(2))], version=6)) != []
        assert monitor.flush(30)
        assert monitor.stats()["attestations_posted"] == 2 and monitor.stats()["internal_errors"] >= 3
    run_id = backend.run_id("attest-hooks")
    got = backend.get(f"/runs/{run_id}/attestations")["attestations"]
    assert sorted(a["version"] for a in got) == [3, 4]


def test_an_attestation_made_while_the_backend_is_down_arrives_when_it_is_back(own_backend: Backend, spool_dir: Path):
    with ParityMonitor("attest-down", side="rollout", url=own_backend.url, spool_dir=spool_dir,
                       max_backoff_s=0.5, flush_interval_s=0.1) as monitor:
        assert monitor.flush(30)
        own_backend.stop()
        assert monitor.attest_weights(state(), version=1)["version"] == 1  # returns at once: queued
        assert not monitor.flush(1)
        own_backend.start()
        assert monitor.flush(60)
    run_id = own_backend.run_id("attest-down")
    assert [a["version"] for a in own_backend.get(f"/runs/{run_id}/attestations")["attestations"]] == [1]
