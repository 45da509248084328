"""A small local journal: what this worker was granted, started and reported.

Append-only JSON lines, fsynced: after a crash (or kill -9) the worker restarted with the
same id knows which attempts it already started, so it never starts a granted attempt
twice, and it can report what it lost.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

Key = tuple[str, int]  # (run_id, attempt)


@dataclass
class Entry:
    run_id: str
    attempt: int
    job_id: str
    phase: str  # granted | started | reported
    info: dict[str, Any] = field(default_factory=dict)


class Journal:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.entries: dict[Key, Entry] = {}
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
        line = orjson.dumps(
            {"run_id": run_id, "attempt": attempt, "job_id": job_id, "phase": phase, "info": info}
        )
        self._file.write(line + b"\n")
        self._file.flush()
        # Durable before the run starts ("granted", "started"): that is what prevents a
        # second start after a crash. A lost "reported" line only repeats a report,
        # which the ledger ignores.
        if phase != "reported":
            os.fsync(self._file.fileno())
        entry = self.entries.setdefault((run_id, attempt), Entry(run_id, attempt, job_id, ""))
        entry.phase = phase
        entry.info.update(info)

    def phase(self, run_id: str, attempt: int) -> str | None:
        entry = self.entries.get((run_id, attempt))
        return entry.phase if entry else None

    def unfinished(self) -> list[Entry]:
        return [e for e in self.entries.values() if e.phase in ("granted", "started")]

    def close(self) -> None:
        self._file.close()
