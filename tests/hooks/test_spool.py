"""The on-disk spool: order, size cap, and leftovers of a crashed process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from trainer_hooks.spool import Spool


def _record(seq: int) -> dict:
    return {"client_id": "c1", "seq": seq, "steps": [seq], "series": {"loss": [seq / 10]}}


def _drain(spool: Spool) -> list[int]:
    seqs = []
    while (record := spool.peek()) is not None:
        seqs.append(record["seq"])
        spool.pop()
    return seqs


def test_replays_in_append_order_and_keeps_working_after_draining(tmp_path: Path) -> None:
    spool = Spool(tmp_path, "owner")
    for seq in range(5):
        assert spool.append(_record(seq))
    assert spool.peek() == spool.peek() == _record(0)  # peek does not consume
    assert _drain(spool) == [0, 1, 2, 3, 4]
    assert spool.is_empty() and spool.own_path.stat().st_size == 0  # truncated once drained
    spool.append(_record(5))
    assert _drain(spool) == [5]


def test_a_batch_that_would_pass_the_size_cap_is_refused(tmp_path: Path) -> None:
    line = len(json.dumps(_record(0), separators=(",", ":"))) + 1
    spool = Spool(tmp_path, "owner", max_bytes=2 * line)
    assert spool.append(_record(0)) and spool.append(_record(1))
    assert not spool.append(_record(2))
    assert _drain(spool) == [0, 1]


def test_close_removes_a_drained_file_and_keeps_an_unsent_one(tmp_path: Path) -> None:
    drained = Spool(tmp_path, "drained")
    drained.append(_record(0))
    _drain(drained)
    drained.close()
    assert not drained.own_path.exists()
    unsent = Spool(tmp_path, "unsent")
    unsent.append(_record(1))
    unsent.close()
    assert unsent.own_path.exists()
    assert _drain(Spool(tmp_path, "next")) == [1]
    assert not unsent.own_path.exists()  # an adopted file is deleted once replayed


def test_a_live_spools_file_is_not_adopted(tmp_path: Path) -> None:
    live = Spool(tmp_path, "live")
    live.append(_record(0))
    other = Spool(tmp_path, "other")
    assert other.adopted == 0 and other.is_empty()
    assert _drain(live) == [0]


def test_leftovers_of_a_killed_process_are_replayed_and_a_torn_line_skipped(tmp_path: Path) -> None:
    writer = textwrap.dedent(f"""
        import sys, time
        from trainer_hooks.spool import Spool
        spool = Spool({str(tmp_path)!r}, "crashed")
        for seq in range(3):
            spool.append({{"client_id": "c1", "seq": seq, "steps": [seq], "series": {{"loss": [0.5]}}}})
        with open(spool.own_path, "ab") as fh:
            fh.write(b'{{"client_id": "c1", "se')  # the crash hit mid-write
        print("ready", flush=True)
        time.sleep(60)
    """)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", writer], cwd=root, stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"ready"
    assert Spool(tmp_path, "while-alive").adopted == 0  # its flock is still held
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    survivor = Spool(tmp_path, "survivor")
    assert survivor.adopted == 1
    assert _drain(survivor) == [0, 1, 2]
    assert survivor.corrupt_lines == 1
    assert not (tmp_path / "crashed.jsonl").exists()


def test_adopted_leftovers_come_before_the_new_processes_own_batches(tmp_path: Path) -> None:
    old = Spool(tmp_path, "old")
    old.append(_record(0))
    old.close()
    new = Spool(tmp_path, "new")
    new.append(_record(1))
    assert _drain(new) == [0, 1]
