"""A run's output, streamed to `run-logs`: the executor appends the job's stdout and
stderr to files in the run's directory; the worker reads what is new and sends it in
16 KiB chunks, up to 1 MiB per (run, attempt, stream), the truncation marked.

Run directories (``runs/<run>/<attempt>``) are removed once the attempt's report was
acknowledged and a retention has passed (the worker's ``keep_s``): `remove_run_dir` for
an attempt the journal forgets, `prune_run_dirs` at start-up for whatever an earlier
incarnation left (by age, sparing the attempts still unfinished)."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer

from schemas.codec import RUN_LOG
from schemas.records import LogStream, RunLogChunk

CHUNK = 16 * 1024
MAX_LOG_BYTES = 1024 * 1024  # per (run, attempt, stream); the rest is dropped, and said so
STREAMS: tuple[LogStream, ...] = ("stdout", "stderr")


@dataclass
class LogTail:
    run_id: str
    attempt: int
    run_dir: Path
    offsets: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STREAMS, 0))
    seq: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STREAMS, 0))

    def send_new(self, producer: Producer, topic: str, worker_id: str) -> None:
        for stream in STREAMS:
            offset = self.offsets[stream]
            if offset >= MAX_LOG_BYTES:
                continue
            try:
                with open(self.run_dir / stream, "rb") as f:
                    f.seek(offset)
                    data = f.read(MAX_LOG_BYTES - offset)
                    more = f.read(1) != b""
            except FileNotFoundError:
                continue
            for i in range(0, len(data), CHUNK):
                piece = data[i : i + CHUNK]
                last = i + CHUNK >= len(data)
                truncated = last and more and offset + len(data) >= MAX_LOG_BYTES
                producer.produce(
                    topic,
                    key=self.run_id.encode(),
                    value=RUN_LOG.encode(
                        RunLogChunk(
                            self.run_id,
                            self.attempt,
                            stream,
                            self.seq[stream],
                            piece.decode(errors="replace"),
                            truncated,
                            worker_id,
                            int(time.time() * 1000),
                        )
                    ),
                )
                self.seq[stream] += 1
            self.offsets[stream] = offset + len(data)


def remove_run_dir(run_dir: Path) -> None:
    """Remove an attempt's directory, and its run's directory once empty."""
    shutil.rmtree(run_dir, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: another attempt of the run is there
        run_dir.parent.rmdir()


def _newest_change(path: Path) -> float:
    """The latest mtime of a directory and of the files in it (the job's output files
    change without changing their directory's mtime)."""
    newest = path.stat().st_mtime
    with os.scandir(path) as found:
        for item in found:
            with contextlib.suppress(OSError):
                newest = max(newest, item.stat(follow_symlinks=False).st_mtime)
    return newest


def prune_run_dirs(runs_root: Path, older_than: float, protected: Collection[Path]) -> int:
    """Remove the attempt directories under `runs_root` unchanged since `older_than`
    (wall clock, s), except the `protected` ones (attempts not yet reported); the
    number removed."""
    if not runs_root.is_dir():
        return 0
    keep = {p.resolve() for p in protected}
    removed = 0
    for run in runs_root.iterdir():
        if not run.is_dir():
            continue
        for attempt in run.iterdir():
            try:
                if attempt.resolve() in keep or _newest_change(attempt) >= older_than:
                    continue
            except OSError:
                continue  # gone meanwhile, or not a directory
            remove_run_dir(attempt)
            removed += 1
        with contextlib.suppress(OSError):
            run.rmdir()  # only when empty
    return removed
