"""A run's output, streamed to `run-logs`: the executor appends the job's stdout and
stderr to files in the run's directory; the worker reads what is new and sends it in
16 KiB chunks, up to 1 MiB per (run, attempt, stream), the truncation marked."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer

from schemas.codec import RUN_LOG

CHUNK = 16 * 1024
MAX_LOG_BYTES = 1024 * 1024  # per (run, attempt, stream); the rest is dropped, and said so
STREAMS = ("stdout", "stderr")


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
                        {
                            "run_id": self.run_id,
                            "attempt": self.attempt,
                            "stream": stream,
                            "seq": self.seq[stream],
                            "data": piece.decode(errors="replace"),
                            "truncated": truncated,
                            "worker_id": worker_id,
                            "at_ms": int(time.time() * 1000),
                        }
                    ),
                )
                self.seq[stream] += 1
            self.offsets[stream] = offset + len(data)
