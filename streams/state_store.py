"""Where the ledger keeps the state records it holds encoded: on the heap, or on disk.

A `StateTable` (streams/state_table.py) holds what the ledger decides about decoded and
everything else as the bytes of its newest record. With a large registry the bytes are
most of the node's memory (a few hundred bytes a job with its key and the dict's slot),
so they can live in a local RocksDB instead (`DiskStore`, through
rocksdict, the binding Faust itself uses for its tables). The store is scratch, never a
source of truth: each takeover writes a partition's records into it afresh from the
compacted topics, nothing in it survives the process (it is deleted on close, and a
directory left by a killed process is deleted by the next one), and no write asks for
durability (no write-ahead log, no sync). So a crash loses nothing the topics do not
hold.

Layout: one database per ledger process, with small memtables and a bounded block cache
so its memory stays a few tens of MB whatever the registry. Each table is a key range:
partition (2 bytes), topic (1 byte: 0 jobs, 1 runs), generation (4 bytes), then the
state's key. A new table for a partition (a takeover, a recovery) takes a new generation
and deletes the older ones of its partition and topic at once, so a restore that fails
half way, or one replaced by the next, leaves nothing behind to read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Final, Literal

from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBatch, WriteOptions

log = logging.getLogger(__name__)

_PREFIX: Final = struct.Struct(">HBI")  # partition, topic, generation
_TOPICS: Final = {"jobs": 0, "runs": 1}
_BATCH: Final = 10_000  # staged writes per WriteBatch while restoring
_MEMTABLE: Final = 8 << 20
_CACHE: Final = 32 << 20

Topic = Literal["jobs", "runs"]


class MemoryStates(dict[str, bytes]):
    """A table's encoded states on the heap (the default for a ledger built in process)."""

    def stage(self, key: str, data: bytes | None) -> None:
        """A record read by a restore: the newest of a key wins, a tombstone drops it."""
        if data is None:
            self.pop(key, None)
        else:
            self[key] = data

    def flush(self) -> None:
        """Nothing staged is held back on the heap."""


class DiskStates(MutableMapping[str, bytes]):
    """One table's encoded states in the process's `DiskStore` (its key range)."""

    __slots__ = ("_db", "_prefix", "_store")

    def __init__(self, store: DiskStore, prefix: bytes):
        self._store = store
        self._db = store.db
        self._prefix = prefix

    def _key(self, key: str) -> bytes:
        return self._prefix + key.encode()

    def stage(self, key: str, data: bytes | None) -> None:
        self._store.stage(self._key(key), data)

    def flush(self) -> None:
        self._store.flush()

    def _read(self, raw: bytes) -> bytes | None:
        data = self._db.get(raw)
        return data if isinstance(data, bytes) else None  # raw mode: bytes or None

    def get(self, key: str, default: bytes | None = None) -> bytes | None:  # type: ignore[override]
        data = self._read(self._key(key))
        return default if data is None else data

    def __getitem__(self, key: str) -> bytes:
        data = self._read(self._key(key))
        if data is None:
            raise KeyError(key)
        return data

    def __setitem__(self, key: str, data: bytes) -> None:
        self._db.put(self._key(key), data)

    def __delitem__(self, key: str) -> None:
        if self.pop(key, None) is None:
            raise KeyError(key)

    def pop(self, key: str, default: bytes | None = None) -> bytes | None:  # type: ignore[override]
        raw = self._key(key)
        data = self._read(raw)
        if data is None:
            return default
        self._db.delete(raw)
        return data

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._key(key) in self._db

    def __iter__(self) -> Iterator[str]:
        size = len(self._prefix)
        for raw in self._db.keys(from_key=self._prefix):
            if not isinstance(raw, bytes) or not raw.startswith(self._prefix):
                return
            yield raw[size:].decode()

    def __len__(self) -> int:
        # A scan of the range: only logs, tests and benchmarks ask (the ledger's loop
        # never does), so no count is kept on the hot path.
        return sum(1 for _ in self)


class DiskStore:
    """The RocksDB database of one ledger process, under `root` (see the module doc)."""

    def __init__(self, root: Path):
        root.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(root)
        self.path = Path(tempfile.mkdtemp(prefix=f"ledger-{os.getpid()}-", dir=root))
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(_MEMTABLE)
        options.set_max_write_buffer_number(2)
        options.set_max_background_jobs(1)
        table = BlockBasedOptions()
        table.set_block_cache(Cache(_CACHE))
        options.set_block_based_table_factory(table)
        self.db = Rdict(str(self.path), options)
        writes = WriteOptions()
        # scratch: the topics are the durable copy (a property; the stub types a method)
        writes.disable_wal = True  # type: ignore[assignment,method-assign]
        self.db.set_write_options(writes)
        self._batch = WriteBatch(raw_mode=True)
        self._generation = 0

    def table(self, partition: int, topic: Topic) -> DiskStates:
        """A new, empty table for `topic` in `partition`; the older ones are gone."""
        self.flush()
        self._generation += 1
        kind = _TOPICS[topic]
        self.db.delete_range(
            _PREFIX.pack(partition, kind, 0), _PREFIX.pack(partition, kind, self._generation)
        )
        return DiskStates(self, _PREFIX.pack(partition, kind, self._generation))

    def drop(self, partition: int) -> None:
        """Forget every table of `partition` (it moved to another owner)."""
        self.flush()
        self.db.delete_range(_PREFIX.pack(partition, 0, 0), _PREFIX.pack(partition + 1, 0, 0))

    def stage(self, raw: bytes, data: bytes | None) -> None:
        if data is None:
            self._batch.delete(raw)
        else:
            self._batch.put(raw, data)
        if len(self._batch) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        if len(self._batch):
            self.db.write(self._batch)
            self._batch = WriteBatch(raw_mode=True)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.db.close()
        shutil.rmtree(self.path, ignore_errors=True)


def _remove_abandoned(root: Path) -> None:
    """Delete the databases of ledger processes that no longer run (killed, so their
    close never ran): each directory's name carries its process id."""
    for path in root.glob("ledger-*-*"):
        try:
            pid = int(path.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        if pid == os.getpid() or _alive(pid):
            continue
        log.info("removing the state store of ledger process %d, which no longer runs", pid)
        shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
