"""The on-disk spool: order, size cap, leftovers of a crashed process, and what it will replay."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
        import sys
        from trainer_hooks.spool import Spool
        spool = Spool({str(tmp_path)!r}, "crashed")
        for seq in range(3):
            spool.append({{"client_id": "c1", "seq": seq, "steps": [seq], "series": {{"loss": [0.5]}}}})
        with open(spool.own_path, "ab") as fh:
            fh.write(b'{{"client_id": "c1", "se')  # the crash hit mid-write
        print("ready", flush=True)
        sys.stdin.read()  # alive, holding the lock, until the test kills it
    """)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", writer], cwd=root, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
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


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def loose_umask():
    """The usual 022: what a spool created without care would get (0755 / 0644)."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_the_spool_directory_is_0700_and_its_files_0600(tmp_path: Path, loose_umask) -> None:
    """Replayed batches go out with this process's token: nobody else may read or plant them."""
    spool = Spool(tmp_path / "cache" / "spool" / "backend", "owner")
    spool.append(_record(0))
    assert _mode(spool.directory) == 0o700
    assert _mode(spool.own_path) == 0o600


def test_an_existing_spool_directory_of_ours_is_tightened(tmp_path: Path, loose_umask) -> None:
    directory = tmp_path / "spool"
    directory.mkdir(mode=0o755)
    Spool(directory, "owner")
    assert _mode(directory) == 0o700


def test_lines_that_are_not_well_formed_records_are_skipped_and_counted(tmp_path: Path) -> None:
    leftover = tmp_path / "dead.jsonl"
    lines = [json.dumps(_record(0)), json.dumps({"seq": "not a record"}), json.dumps([1, 2]),
             json.dumps(_record(1)), '{"client_id": "c1", "se']
    leftover.write_text("\n".join(lines))
    accept = lambda record: None if isinstance(record, dict) and "steps" in record else "not a batch"  # noqa: E731
    spool = Spool(tmp_path, "survivor", accept=accept)
    assert _drain(spool) == [0, 1]
    assert (spool.rejected_lines, spool.corrupt_lines, spool.skipped_lines) == (2, 1, 3)


@pytest.mark.skipif(not hasattr(os, "O_NOFOLLOW"), reason="needs O_NOFOLLOW")
def test_a_symlinked_leftover_is_never_adopted(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text(json.dumps(_record(7)) + "\n")
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir(mode=0o700)
    (spool_dir / "planted.jsonl").symlink_to(elsewhere)
    spool = Spool(spool_dir, "survivor")
    assert spool.adopted == 0 and spool.is_empty()
    assert elsewhere.exists()
