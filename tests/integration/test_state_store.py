"""The ledger's off-heap store (streams/state_store.py) against a real RocksDB on disk."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from schemas.codec import JOB_STATE
from schemas.records import JobState
from streams.state_store import DiskStore
from streams.state_table import StateTable
from tests.support.tables import STEPS, behaves_as_a_dict, state


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DiskStore]:
    disk = DiskStore(tmp_path / "store")
    yield disk
    disk.close()


def test_a_restore_stages_the_newest_value_of_each_key_and_tombstones_drop_keys(
    store: DiskStore,
) -> None:
    a, b = state("a", 1), state("b", 2)
    cold = store.table(3, "jobs")
    cold.stage("a", b"old")
    cold.stage("a", JOB_STATE.encode(a))
    cold.stage("b", JOB_STATE.encode(b))
    cold.stage("c", b"gone")
    cold.stage("c", None)
    cold.flush()
    table = StateTable(JOB_STATE.decode, cold)
    assert (len(table), table.decoded, "a" in table, "c" in table) == (2, 0, True, False)
    assert table.get("a") == a
    assert (len(table), table.decoded) == (2, 1)  # moved to the heap, counted once
    newer = replace(b, fired_ms=9)
    table["b"] = newer
    table.keep_encoded("b", newer, JOB_STATE.encode(newer))
    assert table.decoded == 1
    assert table.get("b") == newer


def test_a_new_table_for_a_partition_replaces_the_older_one_and_others_are_kept(
    store: DiskStore,
) -> None:
    first = store.table(0, "jobs")
    first["a"] = b"1"
    other = store.table(1, "jobs")
    other["a"] = b"x"
    runs = store.table(0, "runs")
    runs["a@1"] = b"r"
    second = store.table(0, "jobs")  # a takeover again: a restore from the topics
    assert "a" not in first
    assert len(second) == 0
    assert other["a"] == b"x"
    assert runs["a@1"] == b"r"
    store.drop(0)  # the partition moved away
    assert "a@1" not in runs
    assert other.get("a") == b"x"


def test_the_store_is_deleted_on_close_and_one_left_by_a_dead_process_is_removed(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    code = (
        "import os, sys; from pathlib import Path; from streams.state_store import DiskStore;"
        "d = DiskStore(Path(sys.argv[1])); d.table(0, 'jobs')['k'] = b'v'; d.flush();"
        "os._exit(0)"  # as if killed: close never runs
    )
    subprocess.run([sys.executable, "-c", code, str(root)], check=True, cwd=os.getcwd())
    left = sorted(root.iterdir())
    assert len(left) == 1
    assert left[0].name.startswith("ledger-")
    store = DiskStore(root)
    assert sorted(root.iterdir()) == [store.path]  # the dead one's removed, its own made
    store.close()
    assert list(root.iterdir()) == []


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(STEPS)
def test_a_table_on_disk_behaves_as_a_dict_whatever_is_kept_encoded(
    store: DiskStore, steps: list[tuple[str, int, bool]]
) -> None:
    table: StateTable[JobState] = StateTable(JOB_STATE.decode, store.table(0, "jobs"))
    behaves_as_a_dict(table, steps)
