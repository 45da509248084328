"""Process lifecycle helpers (streams/lifecycle.py): the lock, the bound, the parent check.

The behaviour end to end (a whole `cronlog run` tree, stops that hang) is in
tests/integration/test_lifecycle.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.lifecycle import (
    DEFAULT_STOP_TIMEOUT_S,
    STOP_TIMEOUT_ENV,
    WATCHDOG_EXIT,
    InstanceRunning,
    hold_instance_lock,
    stop_timeout_s,
)

ROOT = Path(__file__).resolve().parents[2]


def test_a_second_holder_is_refused_and_told_who_holds_it(tmp_path: Path) -> None:
    path = tmp_path / "state" / "run.lock"
    first = hold_instance_lock(path)
    try:
        # flock belongs to the open file: a second open is a second holder, even here.
        with pytest.raises(InstanceRunning) as refused:
            hold_instance_lock(path)
        assert refused.value.pid == os.getpid()
        assert refused.value.path == path
    finally:
        first.close()
    again = hold_instance_lock(path)  # released with its holder: no stale lock
    again.close()


def test_the_lock_dies_with_a_killed_holder(tmp_path: Path) -> None:
    path = tmp_path / "run.lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path;"
            "from streams.lifecycle import hold_instance_lock;"
            f"h = hold_instance_lock(Path({str(path)!r})); print('held', flush=True);"
            "time.sleep(600)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"held"
        with pytest.raises(InstanceRunning) as refused:
            hold_instance_lock(path)
        assert refused.value.pid == holder.pid
    finally:
        holder.kill()
        holder.wait()
    hold_instance_lock(path).close()


@given(st.floats(min_value=0.001, max_value=1e6, allow_nan=False))
def test_the_stop_bound_comes_from_the_environment(seconds: float) -> None:
    os.environ[STOP_TIMEOUT_ENV] = repr(seconds)
    try:
        assert stop_timeout_s(os.environ.get(STOP_TIMEOUT_ENV)) == seconds
    finally:
        del os.environ[STOP_TIMEOUT_ENV]


@pytest.mark.parametrize("raw", ["0", "-3", "soon", "nan-ish"])
def test_a_wrong_stop_bound_is_an_error(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STOP_TIMEOUT_ENV, raw)
    with pytest.raises(ValueError, match=STOP_TIMEOUT_ENV):
        stop_timeout_s(os.environ.get(STOP_TIMEOUT_ENV))


def test_without_a_setting_the_default_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STOP_TIMEOUT_ENV, raising=False)
    assert stop_timeout_s(os.environ.get(STOP_TIMEOUT_ENV)) == DEFAULT_STOP_TIMEOUT_S


def test_a_process_whose_parent_is_already_gone_exits(tmp_path: Path) -> None:
    """The parent died before PR_SET_PDEATHSIG was set (the child now has another
    parent): nobody would ever send the signal, so the child exits at once."""
    code = "from streams.lifecycle import die_with_parent; die_with_parent({}); print('alive')"
    gone = subprocess.run(
        [sys.executable, "-c", code.format(os.getpid() + 1_000_000)],  # no such parent
        cwd=ROOT,
        capture_output=True,
    )
    assert gone.returncode == WATCHDOG_EXIT
    assert b"alive" not in gone.stdout
    kept = subprocess.run(
        [sys.executable, "-c", code.format(os.getpid())], cwd=ROOT, capture_output=True
    )
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.strip() == b"alive"


TRIM_ONCE = """
import threading, time
from streams import lifecycle

said = []
chunks = [bytes(2000) for _ in range(150_000)]  # ~300 MB on malloc's heap, not mmapped
keep = bytes(2000)  # above them: the heap's top cannot shrink, only a trim frees pages
del chunks
before = lifecycle._rss_mb()
lifecycle.trim_malloc_once("test", lambda *a: said.append(a[0] % a[1:]))
lifecycle.trim_malloc_once("again", lambda *a: said.append(a[0] % a[1:]))
for t in threading.enumerate():
    if t.name == "malloc-trim-once":
        t.join()
print(before - lifecycle._rss_mb(), said)
"""


def test_a_catch_up_hands_its_freed_memory_back_once() -> None:
    """What a catch-up frees stays with malloc until a trim (the takeover node kept
    ~200 MB): one trim hands it back, and a second within the gap does nothing."""
    done = subprocess.run(
        [sys.executable, "-c", TRIM_ONCE],
        cwd=ROOT,
        env={**os.environ, "MALLOC_ARENA_MAX": "2"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    freed, said = done.stdout.split(" ", 1)
    assert float(freed) > 200, done.stdout
    assert said.count("handed") == 1, said
    assert "test: handed" in said, said
