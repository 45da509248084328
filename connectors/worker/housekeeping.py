"""The worker's disk stays bounded: finished attempts are forgotten, their run directories
removed and the journal compacted, once their report was acknowledged and `keep_s`
(CRONLOG_WORKER_KEEP_S, default an hour) has passed.

Never lost: an attempt whose report Kafka has not acknowledged is still "started" (or
"claiming") in the journal, so its entry and its directory stay whatever their age; so do
the directories of the attempts the worker holds in memory, and the executor logs those
attempts may still be read from.

When: at start-up (also a scan of the run directories an earlier incarnation left,
and a compaction), then every PRUNE_EVERY_S on the main loop, which forgets what expired
(oldest first, no scan) and compacts the journal when it holds more than twice the lines
it needs.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from connectors.worker.journal import Journal
from connectors.worker.rundirs import prune_run_dirs, remove_run_dir

log = logging.getLogger("cronlog.worker")
DEFAULT_KEEP_S = 3600.0
PRUNE_EVERY_S = 60.0


class Housekeeping:
    def __init__(
        self,
        worker_dir: Path,
        journal: Journal,
        keep_s: float,
        in_use: Callable[[], Iterable[Path]],
        current_log: Callable[[], str],
        clock: Callable[[], float] = time.time,
    ):
        self.dir = worker_dir
        self.journal = journal
        self.keep_s = keep_s
        self.in_use = in_use  # run directories of the attempts in memory
        self.current_log = current_log  # the running executor's log
        self.clock = clock
        self.last = time.monotonic()

    def maybe(self) -> None:
        if time.monotonic() - self.last >= PRUNE_EVERY_S:
            self.run()

    def run(self, *, at_start: bool = False) -> None:
        self.last = time.monotonic()
        cutoff = self.clock() - self.keep_s
        unfinished = self.journal.unfinished()
        protected = {Path(e.info["run_dir"]) for e in unfinished if e.info.get("run_dir")}
        protected.update(self.in_use())
        forgotten = self.journal.prune(cutoff)
        for entry in forgotten:
            run_dir = entry.info.get("run_dir")
            if run_dir and Path(run_dir) not in protected:
                remove_run_dir(Path(run_dir))
        if at_start or self.journal.needs_compaction():
            self.journal.compact()
        scanned = 0
        if at_start:
            # Directories of attempts still remembered (unfinished, or acknowledged less
            # than keep_s ago) stay; the rest is what earlier incarnations left.
            remembered = {
                Path(e.info["run_dir"])
                for e in self.journal.entries.values()
                if e.info.get("run_dir")
            }
            scanned = prune_run_dirs(self.dir / "runs", cutoff, protected | remembered)
        logs = self._prune_executor_logs(
            cutoff, {str(e.info.get("executor_log")) for e in unfinished}
        )
        if forgotten or scanned or logs:
            log.info(
                "housekeeping: forgot %d finished attempts, removed %d old run directories "
                "and %d old executor logs (kept %d attempts)",
                len(forgotten),
                scanned,
                logs,
                len(self.journal.entries),
            )

    def _prune_executor_logs(self, cutoff: float, referenced: set[str]) -> int:
        """Logs of earlier executors that no unfinished attempt may still be read from."""
        removed = 0
        current = self.current_log()
        for path in self.dir.glob("executor.*.log"):
            if str(path) in referenced or str(path) == current:
                continue
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
        return removed
