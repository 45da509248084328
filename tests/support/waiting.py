"""Waiting on real processes: poll a condition, never a fixed sleep in an assertion."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def until_passes(
    check: Callable[[], None], timeout_s: float = 60, *, interval_s: float = 0.3
) -> None:
    """Until `check` stops raising AssertionError, polled every interval_s; after timeout_s
    it runs once more, so the failure is its own message."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            check()
            return
        except AssertionError:
            time.sleep(interval_s)
    check()


def retried(call: Callable[[], T], timeout_s: float = 60, *, interval_s: float = 0.3) -> T:
    """`call()`'s value once it stops raising AssertionError (as `until_passes`)."""
    got: list[T] = []
    until_passes(lambda: got.append(call()), timeout_s, interval_s=interval_s)
    return got[-1]


def eventually(
    check: Callable[[], Any], what: str, timeout_s: float = 60, *, interval_s: float = 0.3
) -> Any:
    """The first truthy value of check(), polled every interval_s; fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")
