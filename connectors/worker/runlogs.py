"""A run's output, streamed to `run-logs`: the job appends its stdout and stderr to files
in the attempt's directory (connectors/worker/rundirs.py); the worker reads what is new,
through `open_output` only, and sends it in 16 KiB chunks, up to 1 MiB per (run,
attempt, stream), the truncation marked."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer

from connectors.worker.rundirs import open_output
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
            fd = open_output(self.run_dir / stream)
            if fd is None:
                continue
            try:
                data = os.pread(fd, MAX_LOG_BYTES - offset + 1, offset)
            except OSError:
                continue
            finally:
                os.close(fd)
            more = len(data) > MAX_LOG_BYTES - offset
            data = data[: MAX_LOG_BYTES - offset]
            for i in range(0, len(data), CHUNK):
                piece = data[i : i + CHUNK]
                last = i + CHUNK >= len(data)
                truncated = last and more and offset + len(data) >= MAX_LOG_BYTES
                try:
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
                except BufferError:
                    # The producer's queue is full (the broker is away): what is not
                    # queued stays in the file, read again from here at the next pass.
                    self.offsets[stream] = offset + i
                    return
                self.seq[stream] += 1
            self.offsets[stream] = offset + len(data)
