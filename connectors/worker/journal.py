"""A small local journal: what this worker claimed, started and reported.

Append-only JSON lines. After a crash (or kill -9) the worker restarted with the same id
knows which attempts it claimed (it asks again, so a reply lost in the crash is not
lost), which it handed to an executor (it never starts those again, and reads their
outcome from that executor's log) and which reports Kafka acknowledged.

Durability by group commit: a "started" line must be on disk before the attempt is handed
to the executor (that is what prevents a second start after a crash), so the worker
writes the lines of a whole batch of grants and calls `sync` once before starting any of
them: one fsync for many starts. Other lines are not fsynced: a lost "claiming" line
loses only a claim (the ledger re-dispatches), a lost "reported" line repeats a report,
which the ledger ignores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

Key = tuple[str, int]  # (run_id, attempt)
UNFINISHED = ("claiming", "started")


@dataclass
class Entry:
    run_id: str
    attempt: int
    job_id: str
    phase: str  # claiming | started | reported | released | dropped
    info: dict[str, Any] = field(default_factory=dict)


class Journal:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.entries: dict[Key, Entry] = {}
        self.dirty = False
        if path.exists():
            for line in path.read_bytes().splitlines():
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # a torn last line from a crash mid-write
                key = (record["run_id"], record["attempt"])
                entry = self.entries.setdefault(
                    key, Entry(record["run_id"], record["attempt"], record["job_id"], "")
                )
                entry.phase = record["phase"]
                entry.info.update(record.get("info", {}))
        self._file = open(path, "ab")  # noqa: SIM115 - kept open for the worker's life

    def record(self, run_id: str, attempt: int, job_id: str, phase: str, **info: Any) -> None:
        """Append a line (written to the OS, not yet fsynced: see `sync`)."""
        line = orjson.dumps(
            {"run_id": run_id, "attempt": attempt, "job_id": job_id, "phase": phase, "info": info}
        )
        self._file.write(line + b"\n")
        self.dirty = True
        entry = self.entries.setdefault((run_id, attempt), Entry(run_id, attempt, job_id, ""))
        entry.phase = phase
        entry.info.update(info)
        if phase in ("reported", "released", "dropped"):
            entry.info = {}  # nothing more is needed of a finished attempt

    def sync(self) -> None:
        """Make every line written so far durable (one fsync for the whole batch)."""
        if self.dirty:
            self._file.flush()
            os.fsync(self._file.fileno())
            self.dirty = False

    def flush(self) -> None:
        self._file.flush()

    def phase(self, run_id: str, attempt: int) -> str | None:
        entry = self.entries.get((run_id, attempt))
        return entry.phase if entry else None

    def unfinished(self) -> list[Entry]:
        return [e for e in self.entries.values() if e.phase in UNFINISHED]

    def close(self) -> None:
        self._file.close()
