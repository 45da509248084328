"""Prometheus metrics and health endpoints of every cronlog process.

Each long-running process (node, its ledger process, worker, projector) serves
on the port it is given (`--metrics-port`, `CRONLOG_METRICS_PORT`; 0 or unset: none):
  /metrics  the Prometheus text format (prometheus_client's registry of this process);
  /healthz  200 while the process runs its loops (liveness);
  /readyz   200 once its consumers are assigned and caught up, else 503 with the reason.
A node's ledger runs in a process of its own and serves on the node's port + 1.
The API serves `/metrics` on its own port, beside its routes.

Names follow Prometheus conventions: the `cronlog_` prefix, base units (`_seconds`,
`_bytes`), `_total` for counters, and labels of bounded cardinality (an owner, a state,
a kind; never a job or run id). Every metric is defined here, in one place, so the
alert rules and the dashboard (compose/prometheus, compose/grafana) can be checked
against one list.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Final

from confluent_kafka import Consumer, KafkaException
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger("cronlog.metrics")

# One registry per component: a process serves those of the components it runs, with the
# default registry's process metrics (CPU, memory, file descriptors), and nothing else.
WORKER: Final = CollectorRegistry()
SCHEDULER: Final = CollectorRegistry()
DISPATCHER: Final = CollectorRegistry()
LEDGER: Final = CollectorRegistry()
INGRESS: Final = CollectorRegistry()
API: Final = CollectorRegistry()
PROJECTOR: Final = CollectorRegistry()
NOTIFIER: Final = CollectorRegistry()
ALL: Final = (WORKER, SCHEDULER, DISPATCHER, LEDGER, INGRESS, API, PROJECTOR, NOTIFIER)

# Start lateness buckets: from on time to the misfire territory of minutes.
LATENESS_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, float("inf"))

# -- runs (workers see the starts; the projector sees every decision) ----------------------
RUN_START_LATENESS = Histogram(
    "cronlog_run_start_lateness_seconds",
    "Start time minus scheduled time of first attempts, per owner (worker).",
    ["owner"],
    buckets=LATENESS_BUCKETS,
    registry=WORKER,
)
RUNS_FINISHED = Counter(
    "cronlog_runs_finished_total",
    "Runs that reached a final state, by state and reason (projector, from run-events).",
    ["state", "reason"],
    registry=PROJECTOR,
)
RUN_TRANSITIONS = Counter(
    "cronlog_run_transitions_total",
    "Run state transitions projected, by the state entered (projector).",
    ["state"],
    registry=PROJECTOR,
)
# -- worker ---------------------------------------------------------------------------------
WORKER_CAPACITY = Gauge(
    "cronlog_worker_capacity",
    "Capacity this worker offers, by resource.",
    ["resource"],
    registry=WORKER,
)
WORKER_USED = Gauge(
    "cronlog_worker_used",
    "Capacity taken by the runs started here, by resource.",
    ["resource"],
    registry=WORKER,
)
WORKER_ATTEMPTS = Gauge(
    "cronlog_worker_attempts", "Attempts this worker holds, by phase.", ["phase"], registry=WORKER
)
WORKER_REPORTS = Counter(
    "cronlog_worker_reports_total",
    "What this worker reported to the ledger, by kind (started, finished, released); a "
    "short run's start and finish go in one record.",
    ["kind"],
    registry=WORKER,
)
# -- node -------------------------------------------------------------------------------------
PROPOSALS = Counter(
    "cronlog_scheduler_proposals_total",
    "Proposals sent to job-log, by kind.",
    ["kind"],
    registry=SCHEDULER,
)
REPEATS_HELD = Counter(
    "cronlog_scheduler_repeats_held_total",
    "Repeats of proposals held because the ledger had not read the last one yet, by kind.",
    ["kind"],
    registry=SCHEDULER,
)
SCHEDULER_TIMERS = Gauge(
    "cronlog_scheduler_timers",
    "Timers held for the owned partitions, by kind.",
    ["kind"],
    registry=SCHEDULER,
)
SCHEDULER_PARTITIONS = Gauge(
    "cronlog_scheduler_partitions",
    "Partitions owned, and how many of them are caught up.",
    ["status"],
    registry=SCHEDULER,
)
PLACEMENTS = Counter(
    "cronlog_dispatcher_placements_total",
    "Dispatch requests answered, by outcome (placed; never_fits: no worker ever could; "
    "taken_back: placed on a worker that went silent before claiming, placed again).",
    ["outcome"],
    registry=DISPATCHER,
)
WORKER_VERDICTS = Counter(
    "cronlog_dispatcher_worker_verdicts_total",
    "Failure-detector verdicts about workers (lost, back).",
    ["verdict"],
    registry=DISPATCHER,
)
WORKER_OFFERS_BOUNDED = Counter(
    "cronlog_dispatcher_worker_offers_bounded_total",
    "Heartbeats whose capacity or labels were above the configured worker limits "
    "(CRONLOG_WORKER_MAX_*, CRONLOG_WORKER_LABELS) and were cut to them.",
    registry=DISPATCHER,
)
RESERVED = Gauge(
    "cronlog_dispatcher_reserved",
    "Worker capacity this dispatcher holds for runs it placed that have not started yet, "
    "by resource (the sum over its workers).",
    ["resource"],
    registry=DISPATCHER,
)
# -- ledger -----------------------------------------------------------------------------------
DECISIONS = Counter(
    "cronlog_ledger_decisions_total",
    "Inputs decided, by outcome (applied, rejected).",
    ["outcome"],
    registry=LEDGER,
)
TXN_SECONDS = Histogram(
    "cronlog_ledger_transaction_seconds",
    "Duration of a committed ledger transaction.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, float("inf")),
    registry=LEDGER,
)
TXN_RECORDS = Histogram(
    "cronlog_ledger_transaction_inputs",
    "Inputs decided per committed transaction (the batch size).",
    buckets=(1, 10, 50, 100, 250, 500, 1000, 5000, float("inf")),
    registry=LEDGER,
)
LEDGER_PARTITIONS = Gauge("cronlog_ledger_partitions", "job-log partitions owned.", registry=LEDGER)
LEDGER_DLQ = Counter(
    "cronlog_dlq_records_total",
    "Records sent to the dead-letter topic, by component.",
    ["component"],
    registry=LEDGER,
)
# -- ingress and the gate (the node's relays, streams/relay.py) ---------------------------------
COMMANDS = Counter(
    "cronlog_ingress_commands_total",
    "Commands read from the commands topic, by outcome (accepted, rejected).",
    ["outcome"],
    registry=INGRESS,
)
GATE_RECORDS = Counter(
    "cronlog_gate_records_total",
    "Records the gate read from worker-reports, by outcome (relayed to job-log, refused to "
    "the DLQ).",
    ["outcome"],
    registry=INGRESS,
)
INGRESS_DLQ = Counter(
    "cronlog_dlq_records_total",
    "Records sent to the dead-letter topic, by component.",
    ["component"],
    registry=INGRESS,
)
# -- projector --------------------------------------------------------------------------------
PROJECTOR_LAG_RECORDS = Gauge(
    "cronlog_projector_lag_records",
    "Records not yet projected, by topic.",
    ["topic"],
    registry=PROJECTOR,
)
PROJECTOR_LAG_SECONDS = Gauge(
    "cronlog_projector_lag_seconds",
    "Age of the newest record projected, by topic.",
    ["topic"],
    registry=PROJECTOR,
)
RUNS_LIVE = Gauge(
    "cronlog_runs_live",
    "Runs not final now, by state (waiting, due, dispatched, running, retrying), as projected.",
    ["state"],
    registry=PROJECTOR,
)
PROJECTED = Counter(
    "cronlog_projector_records_total",
    "Records projected into PostgreSQL, by topic.",
    ["topic"],
    registry=PROJECTOR,
)

# -- notifier ---------------------------------------------------------------------------------
NOTIFICATIONS = Counter(
    "cronlog_notifications_total",
    "Webhook notifications settled, by kind (failed, lost, skipped, late) and outcome "
    "(delivered, dead_lettered).",
    ["kind", "outcome"],
    registry=NOTIFIER,
)
NOTIFICATION_ATTEMPTS = Counter(
    "cronlog_notification_attempts_total",
    "Webhook calls made, by result (ok, retry: 5xx/408/429/no answer, refused: other 4xx).",
    ["result"],
    registry=NOTIFIER,
)
NOTIFIER_WATCHED = Gauge(
    "cronlog_notifier_sla_runs",
    "Runs of SLA jobs not started yet, watched for lateness.",
    registry=NOTIFIER,
)
NOTIFIER_DLQ = Counter(
    "cronlog_dlq_records_total",
    "Records sent to the dead-letter topic, by component.",
    ["component"],
    registry=NOTIFIER,
)


# -- consumer lag of every component that reads a topic -------------------------------------
def _lag_gauge(registry: CollectorRegistry) -> Gauge:
    return Gauge(
        "cronlog_consumer_lag_records",
        "Records a component's consumer has not read yet, by topic: its positions against "
        "the high watermarks its own fetches saw (the projector's: cronlog_projector_lag_records).",
        ["component", "topic"],
        registry=registry,
    )


CONSUMER_LAG: Final = {
    "ingress": _lag_gauge(INGRESS),
    "ledger": _lag_gauge(LEDGER),
    "scheduler": _lag_gauge(SCHEDULER),
    "dispatcher": _lag_gauge(DISPATCHER),
    "worker": _lag_gauge(WORKER),
    "notifier": _lag_gauge(NOTIFIER),
}
CONSUMER_LAG["gate"] = CONSUMER_LAG["ingress"]  # one registry: the node's relays


class ConsumerLag:
    """Sets a component's lag gauge from a consumer, at most every `every_s` seconds.
    Cheap: positions and watermarks are what the consumer already knows (no broker call),
    so a loop may call `report` on every turn."""

    def __init__(self, component: str, prefix: str = "", every_s: float = 5.0):
        self.gauge = CONSUMER_LAG[component]
        self.component = component
        self.prefix = prefix  # cut from topic names: labels read "job-log", not "cronlog.job-log"
        self.every_s = every_s
        self._at = 0.0

    def report(self, consumer: Consumer) -> None:
        now = time.monotonic()
        if now - self._at < self.every_s:
            return
        self._at = now
        behind: dict[str, int] = {}
        try:
            for tp in consumer.position(consumer.assignment()):
                low_high = consumer.get_watermark_offsets(tp, cached=True)
                if low_high is None or low_high[1] < 0 or tp.offset < 0:
                    continue  # not fetched yet: nothing known
                # A worker's own inbox counts as "worker-inbox": one label, not one per id.
                name = tp.topic.removeprefix(self.prefix).split(".", 1)[0]
                behind[name] = behind.get(name, 0) + max(0, low_high[1] - tp.offset)
        except KafkaException:
            return  # the broker away: the gauge keeps its last value
        for name, count in behind.items():
            self.gauge.labels(self.component, name).set(count)


# -- API ----------------------------------------------------------------------------------------
API_REQUESTS = Counter(
    "cronlog_api_requests_total",
    "API requests answered, by route template, method and status code.",
    ["route", "method", "status"],
    registry=API,
)
API_SECONDS = Histogram(
    "cronlog_api_request_duration_seconds",
    "Time to answer an API request, by route template.",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, float("inf")),
    registry=API,
)


def exposition(registries: list[CollectorRegistry]) -> bytes:
    """The Prometheus text of the process metrics and of these registries."""
    return b"".join(generate_latest(r) for r in [REGISTRY, *registries])


def reason_kind(reason: str) -> str:
    """A short label for a run's free-text reason: its first words before any detail (a
    colon, a parenthesis, a word with a digit), "none" if empty."""
    head = reason.strip().lower()
    for stop in (":", "(", "[", ";"):
        head = head.split(stop, 1)[0]
    words = [w for w in head.split() if not any(c.isdigit() for c in w)][:4]
    return "_".join(words)[:40] or "none"


class BoundedLabels:
    """At most `limit` distinct label values; any further one reads as "other" (a label's
    values are series, and series must stay bounded whatever the reasons say)."""

    def __init__(self, limit: int = 50):
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value not in self.seen:
            if len(self.seen) >= self.limit:
                return "other"
            self.seen.add(value)
        return value


def metrics_port(option: int | None, setting: str | None = None) -> int | None:
    """The port to serve on (an option, else `setting`: CRONLOG_METRICS_PORT's value,
    which the entry point reads and passes in), None for none."""
    if option is None:
        raw = (setting or "").strip()
        if not raw:
            return None
        try:
            option = int(raw)
        except ValueError:
            raise ValueError(f"CRONLOG_METRICS_PORT must be a port number, got {raw!r}") from None
    if not 0 <= option <= 65535:
        raise ValueError(f"the metrics port must be in 0..65535, got {option}")
    return option or None


Ready = Callable[[], str | None]  # None: ready; else why not


class MetricsServer:
    """/metrics, /healthz and /readyz on `port`, in a daemon thread."""

    def __init__(
        self,
        port: int,
        registries: list[CollectorRegistry],
        ready: Ready,
        alive: Callable[[], bool] = lambda: True,
        host: str = "0.0.0.0",
    ):
        self.ready, self.alive = ready, alive
        self.registries = registries
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the stdlib's name
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, exposition(server.registries), CONTENT_TYPE_LATEST)
                elif path == "/healthz":
                    ok = server.alive()
                    self._send(200 if ok else 503, b"ok\n" if ok else b"loop stuck\n")
                elif path == "/readyz":
                    why = server.ready()
                    self._send(503 if why else 200, (why or "ready").encode() + b"\n")
                else:
                    self._send(404, b"not found: /metrics, /healthz, /readyz\n")

            def _send(self, code: int, body: bytes, kind: str = "text/plain") -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # the stdlib's signature
                return  # scrapes every few seconds are not worth a log line

        try:
            self.httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:  # a port in use is the operator's to fix, not a traceback
            raise SystemExit(
                f"cronlog: cannot serve metrics and health on port {port}: {exc.strerror}"
            ) from exc
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True)

    def start(self) -> MetricsServer:
        self.thread.start()
        log.info("metrics and health on port %d (/metrics, /healthz, /readyz)", self.port)
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
