"""A scheduler node (`cronlog scheduler`): ingress, ledger, scheduler and dispatcher.

The ledger, the scheduler and the dispatcher are confluent-kafka loops on their own
threads; the Faust
ingress agent owns the main thread and its event loop (Faust handles SIGTERM/SIGINT and
stops the node cleanly). Any loop that dies takes the whole process down with it: a
half-alive node that holds partitions without serving them would stall its jobs until
its session expired, while a dead one loses them in seconds.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable

from faust.worker import Worker

from streams.core.ledger import LedgerConfig
from streams.dispatcher import Dispatcher
from streams.ingress import build_app
from streams.ledger import Ledger
from streams.scheduler import Scheduler, SchedulerConfig
from streams.settings import Settings

log = logging.getLogger("cronlog.node")


def _guarded(name: str, target: Callable[[], None]) -> threading.Thread:
    def body() -> None:
        try:
            target()
        except BaseException:
            log.exception("%s loop died; exiting the node", name)
            logging.shutdown()
            os._exit(70)

    return threading.Thread(target=body, name=name, daemon=True)


def run_node(
    settings: Settings,
    node_id: str | None = None,
    lead_ms: int = 10_000,
    ledger_config: LedgerConfig = LedgerConfig(),
    loglevel: str = "info",
) -> None:
    node_id = node_id or f"{socket.gethostname()}-{os.getpid()}"
    ledger = Ledger(settings, ledger_config, node_id=node_id)
    scheduler = Scheduler(settings, node_id, SchedulerConfig(lead_ms=lead_ms))
    dispatcher = Dispatcher(settings, node_id)
    parts: dict[str, Ledger | Scheduler | Dispatcher] = {
        "ledger": ledger,
        "scheduler": scheduler,
        "dispatcher": dispatcher,
    }
    threads = [_guarded(name, part.run) for name, part in parts.items()]
    for thread in threads:
        thread.start()
    log.info("node %s started: ingress, ledger, scheduler, dispatcher", node_id)
    app = build_app(settings)
    try:
        Worker(app, loglevel=loglevel, quiet=True).execute_from_commandline()
    finally:
        for part in parts.values():
            part.stop()
        for thread in threads:
            thread.join(15)
