"""A node (`cronlog scheduler`): ingress, gate, ledger, scheduler and dispatcher.

Ingress, the gate, the scheduler and the dispatcher are confluent-kafka loops on their
own threads; the main thread waits for SIGTERM/SIGINT and then stops them all. The
ledger, the busiest loop, runs in a child process by default so that it does not share
the GIL with the rest: on 2 cores that lifts the node's throughput (see
docs/performance.md); `--ledgers N` runs N of them, members of the one ledger group, for
more cores. The child dies with the node (PR_SET_PDEATHSIG, so even a SIGKILL
of the node takes its ledger with it) and the node dies with the child. Any loop that
dies takes the whole node down with it: a half-alive node that holds partitions without
serving them would stall its jobs until its session expired, while a dead one loses them
in seconds.

A broker outage is not a loop dying: a node started while the broker is down waits for
it (saying so every few seconds), and once running every loop keeps retrying while the
broker is down and resumes by itself when it is back (the loops treat client errors as
transient and retry; the ledger bounds its transactional calls with a watchdog,
streams/ledger.py). Only a loop that fails for another reason takes the node down, and
the supervisor restarts it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import faulthandler
import logging
import multiprocessing
import multiprocessing.process
import os
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from streams import metrics
from streams.core.ledger import LedgerConfig
from streams.core.proposals import ProposalPolicy
from streams.dispatcher import Dispatcher
from streams.gate import Gate
from streams.identity import NodeIdTaken
from streams.ingress import Ingress
from streams.kafka import wait_for_broker
from streams.ledger import Ledger
from streams.lifecycle import die_with_parent as _die_with_parent
from streams.lifecycle import limit_malloc_arenas, trim_malloc_every
from streams.logs import LogFormat
from streams.logs import configure as configure_logging
from streams.metrics import MetricsServer
from streams.scheduler import Scheduler, SchedulerConfig
from streams.settings import Settings

log = logging.getLogger("cronlog.node")


def _name_os_thread(name: str) -> None:
    """Give the calling thread its OS name (Python 3.11 names only its own Thread
    object), so /proc/<pid>/task/<tid>/comm tells the loops apart: bench.costs reads
    CPU per loop from there. Best effort: Linux only, never fatal."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(15, name[:15].encode(), 0, 0, 0)  # PR_SET_NAME


def _guarded(name: str, target: Callable[[], None]) -> threading.Thread:
    def body() -> None:
        _name_os_thread(name)
        try:
            target()
        except BaseException:
            log.exception("%s loop died; exiting the node", name)
            logging.shutdown()
            os._exit(70)

    return threading.Thread(target=body, name=name, daemon=True)


def _dump_stacks_on_sigusr1() -> None:
    """`kill -USR1` prints every thread's stack to stderr: what a stuck loop waits on."""
    with contextlib.suppress(AttributeError, ValueError, RuntimeError):
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def _ledger_main(
    settings: Settings,
    config: LedgerConfig,
    node_id: str,
    loglevel: str,
    store_dir: Path | None,
    log_format: LogFormat = "text",
    metrics_port: int | None = None,
    share: tuple[int, int] = (0, 1),
    malloc_trim_s: float = 0.0,
) -> None:
    _die_with_parent()
    trim_malloc_every(malloc_trim_s)  # the node's CRONLOG_MALLOC_TRIM_S; MALLOC_ARENA_MAX: the env
    _dump_stacks_on_sigusr1()
    configure_logging(loglevel, "ledger", node_id, log_format)
    try:
        ledger = Ledger(settings, config, node_id=node_id, store_dir=store_dir, share=share)
        if metrics_port is not None:  # the node's port + 1 + its index (streams/metrics.py)
            MetricsServer(metrics_port, [metrics.LEDGER], ledger.ready).start()
        signal.signal(signal.SIGTERM, lambda *_: ledger.stop())
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the node stops it with SIGTERM
        ledger.run()
    except NodeIdTaken as exc:  # the node dies with it, saying why (streams/identity.py)
        log.error("%s", exc)
        raise SystemExit(3) from exc


def ledger_id(node_id: str, index: int) -> str:
    """The id of a node's ledger process `index` (its transactional.id derives from it):
    the node's own for the first, so one ledger per node keeps the id it always had, and
    stable per (node, index) so that a restarted node fences what its ledgers left."""
    return node_id if index == 0 else f"{node_id}-ledger{index}"


def _watch(child: multiprocessing.process.BaseProcess, stopping: threading.Event) -> None:
    child.join()
    if not stopping.is_set():
        log.error("ledger process exited with %s; exiting the node", child.exitcode)
        logging.shutdown()
        os._exit(70)


def run_node(
    settings: Settings,
    node_id: str | None = None,
    lead_ms: int = 10_000,
    lookahead_ms: int = 600_000,
    lookahead_per_s: float = 1000.0,
    ledger_config: LedgerConfig = LedgerConfig(),
    loglevel: str = "info",
    ledger_process: bool = True,
    store_dir: Path | None = None,
    log_format: LogFormat = "text",
    metrics_port: int | None = None,
    ledgers: int = 1,
    malloc_trim_s: float = 0.0,
) -> None:
    """Run a node until stopped. `store_dir`: where the ledger keeps the states it holds
    encoded (a RocksDB scratch store, streams/state_store.py); None keeps them on the heap.
    `ledgers`: ledger processes (members of the one ledger group, so they split the node's
    share of the partitions); more than one uses more cores for the decisions.
    `malloc_trim_s`: trim malloc's free memory this often, in the node and its ledger
    processes (CRONLOG_MALLOC_TRIM_S, read by the command; 0: never)."""
    if ledgers < 1 or (ledgers > 1 and not ledger_process):
        raise ValueError(f"ledgers must be >= 1, and 1 in the node's own process ({ledgers})")
    node_id = node_id or f"{socket.gethostname()}-{os.getpid()}"
    limit_malloc_arenas()
    trim_malloc_every(malloc_trim_s)
    _dump_stacks_on_sigusr1()
    if lookahead_ms >= ledger_config.max_lead_ms:
        raise ValueError(
            f"the look-ahead ({lookahead_ms} ms) must be below the ledger's max lead "
            f"({ledger_config.max_lead_ms} ms), which rejects earlier proposals"
        )
    # The node waits for the broker before it joins any group, saying so; once running,
    # every loop rides out an outage by itself (module docstring).
    wait_for_broker(settings, f"node {node_id}")
    policy = ProposalPolicy(
        lead_ms=lead_ms,
        horizon_ms=lookahead_ms if lead_ms > 0 else 0,  # pre-dispatch off: no look-ahead
        early_per_s=lookahead_per_s,
    )
    scheduler = Scheduler(settings, node_id, SchedulerConfig(proposals=policy))
    dispatcher = Dispatcher(settings, node_id)
    parts: dict[str, Ledger | Scheduler | Dispatcher | Gate | Ingress] = {
        "scheduler": scheduler,
        "dispatcher": dispatcher,
        "gate": Gate(settings),
        "ingress": Ingress(settings),
    }
    stopping = threading.Event()
    children: list[multiprocessing.process.BaseProcess] = []
    if ledger_process:
        for index in range(ledgers):
            port = None if metrics_port is None else metrics_port + 1 + index
            child = multiprocessing.get_context("spawn").Process(
                target=_ledger_main,
                args=(
                    settings,
                    ledger_config,
                    ledger_id(node_id, index),
                    loglevel,
                    store_dir,
                    log_format,
                    port,
                    (index, ledgers),
                    malloc_trim_s,
                ),
                name="ledger" if index == 0 else f"ledger{index}",
            )
            child.start()
            children.append(child)
            threading.Thread(target=_watch, args=(child, stopping), daemon=True).start()
    else:
        parts["ledger"] = Ledger(settings, ledger_config, node_id=node_id, store_dir=store_dir)
    threads = [_guarded(name, part.run) for name, part in parts.items()]
    for thread in threads:
        thread.start()
    if metrics_port is not None:
        registries = [metrics.SCHEDULER, metrics.DISPATCHER, metrics.INGRESS]
        ready: list[Callable[[], str | None]] = [scheduler.ready]
        if not ledger_process:
            registries.append(metrics.LEDGER)
            ready.append(parts["ledger"].ready)  # type: ignore[union-attr]
        MetricsServer(
            metrics_port,
            registries,
            lambda: next((why for check in ready if (why := check())), None),
            alive=lambda: all(thread.is_alive() for thread in threads),
        ).start()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    log.info("node %s started: ingress, gate, ledger, scheduler, dispatcher", node_id)
    try:
        while not stop.wait(0.5):  # a signal handler runs between these waits
            pass
        log.info("node %s stopping", node_id)
    finally:
        stopping.set()
        for part in parts.values():
            part.stop()
        for process in children:
            if process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        for process in children:
            process.join(15)
        for thread in threads:
            thread.join(15)
