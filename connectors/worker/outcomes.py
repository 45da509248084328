"""What a run is reported as, from how its executor says it ended: its exit code and its
reason (the ledger's `RunFinished.exit_code` and `error`)."""

from __future__ import annotations

from dataclasses import replace

from connectors.worker.executor import Finished


def exit_code_of(event: Finished) -> int | None:
    """The exit code reported: none for a run that did not exit by itself, nor for one
    whose output was cut (a failure, even if it then exited 0: what it wrote is lost)."""
    if event.outcome != "exited" or (event.output_cut and event.exit_code == 0):
        return None
    return event.exit_code


def error_of(event: Finished) -> str:
    if event.output_cut:
        rest = error_of(replace(event, output_cut=""))
        return f"{event.output_cut}; {rest}" if rest else event.output_cut
    if event.outcome == "exited":
        return f"killed by signal {event.signal}" if event.signal else ""
    return {
        "timeout": "timed_out: killed after the timeout",
        "fenced": f"fenced: the worker could not prove it was alive ({event.error})",
        "cancelled": "cancelled",
    }.get(event.outcome, f"error: {event.error}")
