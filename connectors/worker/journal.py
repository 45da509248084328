"""A small local journal: what this worker claimed, started and reported.

Append-only JSON lines. After a crash (or kill -9) the worker restarted with the same id
knows which attempts it claimed (it asks again, so a reply lost in the crash is not
lost), which it handed to an executor (it never starts those again, and reads their
outcome from that executor's log) and which reports Kafka acknowledged.

Durability by group commit: a "started" line must be on disk before the attempt is handed
to the executor (that is what prevents a second start after a crash), so the worker
writes the lines of a whole batch of grants and calls `sync` once before starting any of
them: one fsync for many starts. Other lines are not fsynced (the worker flushes them to
the OS after each batch of its inbox, so a kill -9 keeps them; a machine crash may not):
a lost "claiming" line loses only the worker's memory of a claim (should the claim have
been granted, the reply, not yet committed in the inbox, is read again after the restart
and the worker releases the attempt), a lost "reported" line repeats a report, which
the ledger ignores.

Bounded: an attempt is finished once Kafka acknowledged its report (or its release, or
the claim was dropped). A finished attempt is remembered for a while (repeated
assignments and late claim replies are recognised by it), then `prune` forgets it, and
`compact` rewrites the file with one line per attempt still remembered: to a temporary
file, fsynced, renamed over the journal, the directory fsynced. A crash at any point
leaves either the old journal or the new one, both complete; an attempt whose report was
not acknowledged is never pruned.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

Key = tuple[str, int]  # (run_id, attempt)
UNFINISHED = ("claiming", "started")
FINISHED = ("reported", "released", "dropped")
# Compact once the file holds this many more lines than twice the remembered attempts.
COMPACT_SLACK = 1000


@dataclass
class Entry:
    run_id: str
    attempt: int
    job_id: str
    phase: str  # claiming | started | reported | released | dropped
    info: dict[str, Any] = field(default_factory=dict)
    at: float = 0.0  # wall clock (s) of the latest phase: when it finished, once finished


class Journal:
    def __init__(self, path: Path, clock: Any = time.time):
        self.path = path
        self.clock = clock
        path.parent.mkdir(parents=True, exist_ok=True)
        self.entries: dict[Key, Entry] = {}
        # (when, key) of every attempt that finished, oldest first: what `prune` walks.
        self.finished: deque[tuple[float, Key]] = deque()
        self.dirty = False
        self.lines = 0
        loaded_at = clock()
        if path.exists():
            for line in path.read_bytes().splitlines():
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # a torn last line from a crash mid-write
                self.lines += 1
                # Lines written before the journal had times: as if written now.
                at = float(record.get("at", loaded_at))
                self._apply(
                    record["run_id"],
                    record["attempt"],
                    record["job_id"],
                    record["phase"],
                    record.get("info", {}),
                    at,
                )
            ended = [(e.at, k) for k, e in self.entries.items() if e.phase in FINISHED]
            self.finished = deque(sorted(ended))
        self._file = open(path, "ab")  # noqa: SIM115 - kept open for the worker's life

    def _apply(
        self, run_id: str, attempt: int, job_id: str, phase: str, info: dict[str, Any], at: float
    ) -> None:
        """A line's effect on the attempts remembered (the same on writing and loading)."""
        entry = self.entries.setdefault((run_id, attempt), Entry(run_id, attempt, job_id, ""))
        entry.phase, entry.at = phase, at
        entry.info.update(info)
        if phase in FINISHED:
            # Nothing more is needed of a finished attempt but where its output is.
            run_dir = entry.info.get("run_dir")
            entry.info = {"run_dir": run_dir} if run_dir else {}
            self.finished.append((at, (run_id, attempt)))

    def record(self, run_id: str, attempt: int, job_id: str, phase: str, **info: Any) -> None:
        """Append a line (buffered: `flush` hands it to the OS, `sync` makes it durable)."""
        at = self.clock()
        line = orjson.dumps(
            {
                "run_id": run_id,
                "attempt": attempt,
                "job_id": job_id,
                "phase": phase,
                "info": info,
                "at": at,
            }
        )
        self._file.write(line + b"\n")
        self.lines += 1
        self.dirty = True
        self._apply(run_id, attempt, job_id, phase, info, at)

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

    def prune(self, finished_before: float) -> list[Entry]:
        """Forget the attempts that finished before `finished_before` (wall clock, s) and
        have not been assigned again since; return them (their run directories may go).
        Unfinished attempts are never forgotten."""
        gone: list[Entry] = []
        while self.finished and self.finished[0][0] < finished_before:
            at, key = self.finished.popleft()
            entry = self.entries.get(key)
            if entry is None or entry.phase not in FINISHED or entry.at != at:
                continue  # assigned again (or finished again later): not this one
            del self.entries[key]
            gone.append(entry)
        return gone

    def needs_compaction(self) -> bool:
        return self.lines > 2 * len(self.entries) + COMPACT_SLACK

    def compact(self) -> None:
        """Rewrite the journal as one line per remembered attempt, crash-safely: the
        temporary file is fsynced before it replaces the journal, and the directory after,
        so that the rename itself survives a power cut."""
        self._file.flush()
        tmp = self.path.with_name(self.path.name + ".compact")
        with open(tmp, "wb") as out:
            for entry in self.entries.values():
                line = {
                    "run_id": entry.run_id,
                    "attempt": entry.attempt,
                    "job_id": entry.job_id,
                    "phase": entry.phase,
                    "info": entry.info,
                    "at": entry.at,
                }
                out.write(orjson.dumps(line) + b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(self.path.parent)
        self._file.close()
        self._file = open(self.path, "ab")  # noqa: SIM115 - kept open for the worker's life
        self.lines = len(self.entries)
        self.dirty = False

    def close(self) -> None:
        self._file.close()


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with contextlib.suppress(OSError):  # some filesystems refuse fsync on a directory
            os.fsync(fd)
    finally:
        os.close(fd)
