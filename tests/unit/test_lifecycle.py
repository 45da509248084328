"""Process lifecycle helpers (streams/lifecycle.py): the lock, the bound, the parent check.

The behaviour end to end (a whole `cronlog run` tree, stops that hang) is in
tests/integration/test_lifecycle.py."""

from __future__ import annotations

import ctypes
import ctypes.util
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
    TrimPolicy,
    hold_instance_lock,
    malloc_free_bytes,
    resident_bytes,
    stop_timeout_s,
    trim_setting,
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
        assert stop_timeout_s() == seconds
    finally:
        del os.environ[STOP_TIMEOUT_ENV]


@pytest.mark.parametrize("raw", ["0", "-3", "soon", "nan-ish"])
def test_a_wrong_stop_bound_is_an_error(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STOP_TIMEOUT_ENV, raw)
    with pytest.raises(ValueError, match=STOP_TIMEOUT_ENV):
        stop_timeout_s()


def test_without_a_setting_the_default_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(STOP_TIMEOUT_ENV, raising=False)
    assert stop_timeout_s() == DEFAULT_STOP_TIMEOUT_S


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


MB = 1 << 20


def test_trimming_waits_for_memory_freed_since_the_last_trim() -> None:
    policy = TrimPolicy(grow_bytes=64 * MB)
    assert not policy.due(100 * MB)  # the first look is the low mark
    assert not policy.due(40 * MB)  # reused: the low mark follows it down
    assert not policy.due(103 * MB)  # 63 MB freed since
    assert policy.due(104 * MB)
    policy.trimmed(104 * MB)  # a trim leaves its chunks free
    assert not policy.due(150 * MB)
    assert policy.due(168 * MB)


@given(st.lists(st.integers(min_value=0, max_value=4096), min_size=1, max_size=200))
def test_a_load_that_frees_and_reuses_within_the_bound_is_never_trimmed(
    frees: list[int],
) -> None:
    """Free memory that swings up and down within 64 MB never costs a trim's stall, and
    one that swings further always does, at the first look that shows it."""
    policy = TrimPolicy(grow_bytes=64 * MB)
    low = frees[0] * MB
    for free in frees:
        low = min(low, free * MB)
        assert policy.due(free * MB) == (free * MB - low >= 64 * MB)
        if free * MB - low >= 64 * MB:
            policy.trimmed(free * MB)
            low = free * MB


@pytest.mark.parametrize(
    ("raw", "chosen"),
    [
        (None, None),
        ("", None),
        ("auto", None),
        (" Auto ", None),
        ("off", 0.0),
        ("0", 0.0),
        ("10", 10.0),
    ],
)
def test_the_trim_setting(raw: str | None, chosen: float | None) -> None:
    assert trim_setting(raw) == chosen


@pytest.mark.parametrize("raw", ["sometimes", "-5"])
def test_a_wrong_trim_setting_is_an_error_that_names_it(raw: str) -> None:
    with pytest.raises(ValueError, match="CRONLOG_MALLOC_TRIM_S"):
        trim_setting(raw)


def test_a_process_that_grew_and_freed_is_trimmed_back() -> None:
    """A real process: it allocates ~400 MB in small blocks, frees all but one block in
    64 (so the heap's top stays and glibc alone would keep the rest), and by default
    trims it back (`trim_malloc`, once that much is free); with trimming off it keeps it."""
    code = (
        "import ctypes, ctypes.util, time, streams.lifecycle as l\n"
        "l.TRIM_CHECK_S = 0.1\n"
        "libc = ctypes.CDLL(ctypes.util.find_library('c'))\n"
        "libc.malloc.restype = ctypes.c_void_p\n"
        "l.trim_malloc()\n"
        "time.sleep(0.3)\n"
        "blocks = [libc.malloc(4096) for _ in range(100_000)]\n"
        "for b in blocks: ctypes.memset(b, 1, 4096)\n"
        "grown = l.resident_bytes()\n"
        "for i, b in enumerate(blocks):\n"
        "    if i % 64: libc.free(ctypes.c_void_p(b))\n"
        "time.sleep(1.0)\n"
        "print(grown, l.resident_bytes())\n"
    )
    sizes = {}
    for setting in ("auto", "off"):
        env = {**os.environ, "CRONLOG_MALLOC_TRIM_S": setting, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        grown, after = map(int, out.stdout.split())
        sizes[setting] = (grown, after)
    grown, after = sizes["auto"]
    assert grown > 300 * MB
    assert after < grown - 200 * MB, sizes
    grown, after = sizes["off"]
    assert after > grown - 50 * MB, sizes


def test_this_process_knows_its_resident_memory_and_mallocs_free_bytes() -> None:
    rss = resident_bytes()
    assert rss is not None
    assert rss > 10 * MB
    probe = malloc_free_bytes()
    assert probe is not None
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    before = probe()
    blocks = [libc.malloc(4096) for _ in range(2000)]
    fence = libc.malloc(4096)  # keeps the freed blocks off the heap's top
    for block in blocks:
        libc.free(ctypes.c_void_p(block))
    assert probe() >= before + 2000 * 4096 // 2  # what was freed shows as free
    libc.free(ctypes.c_void_p(fence))


def test_the_scheduler_command_refuses_a_wrong_trim_setting() -> None:
    """Refused before anything starts, naming the variable and what it takes."""
    from typer.testing import CliRunner

    from connectors.cli import app

    result = CliRunner().invoke(app, ["scheduler"], env={"CRONLOG_MALLOC_TRIM_S": "often"})
    assert result.exit_code == 2
    assert "CRONLOG_MALLOC_TRIM_S must be auto, off or seconds, not 'often'" in result.output
