"""The run directory as a boundary (connectors/worker/rundirs.py): one directory per run
id, never reused, output files made before the job exists, and read by the worker only
when they are still its regular files (a link or a FIFO in their place is not read and
never blocks)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.worker.rundirs import (
    RunDirError,
    attempt_dir,
    name_of,
    open_output,
    prepare,
)
from connectors.worker.runlogs import LogTail

run_ids = st.text(min_size=1, max_size=300)


@given(run_ids, run_ids)
def test_two_run_ids_never_share_a_directory(a: str, b: str) -> None:
    if a != b:
        assert name_of(a) != name_of(b)


@given(run_ids)
def test_a_name_is_one_plain_file_name(run_id: str) -> None:
    name = name_of(run_id)
    assert "/" not in name
    assert "\0" not in name
    assert name not in (".", "..")
    assert len(name.encode()) <= 200 or name.startswith("h")
    assert len(name.encode()) <= 255


def test_the_names_that_collided_before_do_not() -> None:
    # The old mapping replaced every other character by "_": all of these were "a_b".
    names = {name_of(r) for r in ("a/b", "a_b", "a b", "a%b", "a.b", "a_b ")}
    assert len(names) == 6
    assert name_of("..") != ".."
    assert name_of(".") != "."


def test_an_attempt_directory_is_made_fresh_or_refused(tmp_path: Path) -> None:
    run_dir = attempt_dir(tmp_path / "runs", "job@1", 1)
    made = prepare(run_dir, None)
    made.close()
    assert (run_dir / "work").is_dir()
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o711
    assert stat.S_IMODE((run_dir / "work").stat().st_mode) == 0o700
    for stream in ("stdout", "stderr"):
        info = (run_dir / stream).lstat()
        assert stat.S_ISREG(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o600
    with pytest.raises(RunDirError, match="exists already"):
        prepare(run_dir, None)


def test_a_run_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / name_of("job@2")).symlink_to(elsewhere)
    with pytest.raises(RunDirError, match="not a directory"):
        prepare(attempt_dir(runs, "job@2", 1), None)
    assert list(elsewhere.iterdir()) == []


def test_the_output_is_written_through_the_descriptors(tmp_path: Path) -> None:
    run_dir = attempt_dir(tmp_path / "runs", "job@3", 1)
    made = prepare(run_dir, None)
    os.write(made.stdout, b"out\n")
    os.write(made.stderr, b"err\n")
    made.close()
    assert (run_dir / "stdout").read_bytes() == b"out\n"
    assert (run_dir / "stderr").read_bytes() == b"err\n"


def test_only_a_regular_file_is_read(tmp_path: Path) -> None:
    regular = tmp_path / "regular"
    regular.write_text("mine")
    fd = open_output(regular)
    assert fd is not None
    os.close(fd)
    secret = tmp_path / "secret"
    secret.write_text("not yours")
    link = tmp_path / "link"
    link.symlink_to(secret)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert open_output(link) is None
    assert open_output(fifo) is None  # and returned at once: no writer ever opens it
    assert open_output(tmp_path) is None
    assert open_output(tmp_path / "missing") is None


class Recorder:
    def __init__(self) -> None:
        self.values: list[bytes] = []

    def produce(self, topic: str, key: bytes, value: bytes) -> None:
        self.values.append(value)


def test_a_job_that_swaps_its_output_for_a_fifo_or_a_link_does_not_stop_the_tail(
    tmp_path: Path,
) -> None:
    run_dir = attempt_dir(tmp_path / "runs", "job@4", 1)
    made = prepare(run_dir, None)
    os.write(made.stdout, b"before\n")
    made.close()
    secret = tmp_path / "secret"
    secret.write_text("TOP-SECRET")
    (run_dir / "stdout").unlink()
    os.mkfifo(run_dir / "stdout")
    (run_dir / "stderr").unlink()
    (run_dir / "stderr").symlink_to(secret)
    tail = LogTail("job@4", 1, run_dir)
    sent = Recorder()
    worker = threading.Thread(target=tail.send_new, args=(sent, "run-logs", "w1"), daemon=True)
    worker.start()
    worker.join(5)
    assert not worker.is_alive(), "the tail blocked on a FIFO"
    assert not any(b"TOP-SECRET" in v for v in sent.values)
