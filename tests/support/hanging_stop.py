"""A process whose stop hangs, to test the stop watchdog (streams/lifecycle.py).

    python -m tests.support.hanging_stop MODE HANG

MODE is how the process learns of SIGTERM/SIGINT, as cronlog's commands do:
  plain     a handler set with signal.signal (the scheduler, worker and projector commands)
  interrupt Python's default SIGINT handler: KeyboardInterrupt
HANG is what its stop then does:
  none      nothing: it exits 0 at once (the watchdog must not fire)
  released  blocks in a C call that releases the GIL, like a librdkafka call that
            ignores its timeout
  held      blocks in a C call that holds the GIL: no Python thread runs again

The watchdog is installed first, as connectors/cli/common.py does; it prints "ready" once its
handlers are in place.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

from streams.lifecycle import STOP_TIMEOUT_ENV, install_stop_watchdog, stop_timeout_s


def hang(how: str) -> None:
    if how == "released":
        time.sleep(3600)  # the GIL is released, as in a hung confluent-kafka call
    elif how == "held":
        ctypes.PyDLL(None).sleep(3600)  # a PyDLL call keeps the GIL


def ready() -> None:
    sys.stdout.write("ready\n")
    sys.stdout.flush()


def main() -> None:
    mode, how = sys.argv[1], sys.argv[2]
    install_stop_watchdog(stop_timeout_s(os.environ.get(STOP_TIMEOUT_ENV)))
    if mode == "plain":
        stopping = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
        ready()
        stopping.wait()
        hang(how)
    elif mode == "interrupt":
        ready()
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            hang(how)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
