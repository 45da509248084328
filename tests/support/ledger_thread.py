"""A real `Ledger` run in a thread of the test, for tests that drive one directly."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from streams.ledger import Ledger


@contextmanager
def running(ledger: Ledger) -> Iterator[None]:
    """`ledger.run()` in a thread for the block, stopped after it; fails if it died."""
    failed: list[BaseException] = []

    def body() -> None:
        try:
            ledger.run()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            failed.append(exc)

    thread = threading.Thread(target=body, name="ledger", daemon=True)
    thread.start()
    try:
        yield
    finally:
        ledger.stop()
        thread.join(60)
    assert not failed, f"the ledger process died: {failed[0]!r}"
