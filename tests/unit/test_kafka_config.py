"""One place configures every Kafka client: CRONLOG_KAFKA_CONFIG's properties reach every
confluent-kafka client through streams/kafka.py; no client in the product is built any
other way."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from connectors.worker.worker import HEARTBEAT_PRODUCER
from streams.core.timing import TIMING
from streams.kafka import (
    TRANSACTION_LINGER_MS,
    admin_config,
    connection_config,
    consumer_config,
    producer_config,
    transactional_producer_config,
)
from streams.settings import Settings, SettingsError, read_client_properties

ROOT = Path(__file__).resolve().parents[2]
SECURED = """
# a managed cluster
security.protocol=SASL_SSL
sasl.mechanism = SCRAM-SHA-512
sasl.username=cronlog-ledger
sasl.password=pa=ss
! another comment
ssl.ca.location=/etc/ssl/certs/ca-certificates.crt
"""


def props(tmp_path: Path, text: str) -> tuple[tuple[str, str], ...]:
    path = tmp_path / "client.properties"
    path.write_text(text)
    return read_client_properties(str(path))


def test_the_properties_file_is_read_and_given_to_every_builder(tmp_path: Path) -> None:
    found = props(tmp_path, SECURED)
    assert dict(found) == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "cronlog-ledger",
        "sasl.password": "pa=ss",
        "ssl.ca.location": "/etc/ssl/certs/ca-certificates.crt",
    }
    settings = Settings(kafka="k1:9093,k2:9093", kafka_config=found)
    for config in (
        connection_config(settings),
        admin_config(settings),
        producer_config(settings),
        transactional_producer_config(settings, "t-1"),
        consumer_config(settings, "g"),
        consumer_config(settings, None),
    ):
        assert config["bootstrap.servers"] == "k1:9093,k2:9093"
        assert {k: config[k] for k, _ in found} == dict(found)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("security.protocol SASL_SSL", "expected key=value"),
        ("=x", "expected key=value"),
        ("bootstrap.servers=evil:9092", "set by cronlog"),
        ("group.id=x", "set by cronlog"),
    ],
)
def test_a_bad_properties_file_is_refused_with_its_line(
    tmp_path: Path, text: str, words: str
) -> None:
    with pytest.raises(SettingsError, match=words):
        props(tmp_path, text)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read"):
        Settings.from_env({"CRONLOG_KAFKA_CONFIG": str(tmp_path / "none.properties")})


# -- no client built anywhere else --------------------------------------------------------
CLIENTS = {"Producer", "Consumer", "AdminClient"}
BUILDERS = {
    "connection_config",
    "admin_config",
    "producer_config",
    "transactional_producer_config",
    "consumer_config",
}
# The local stack's own probe of the plaintext broker it just started, before any
# cronlog configuration applies (connectors/stack/kafka.py).
EXEMPT = {("connectors/stack/kafka.py", "AdminClient")}
# `streams.kafka.Clients` builds each client from a config it is given: its callers are
# checked instead (`clients.consumer(...)`, `self.clients.producer(...)`).
EXEMPT |= {("streams/kafka.py", name) for name in CLIENTS}
FACTORY = {"consumer": "Consumer", "producer": "Producer", "admin": "AdminClient"}


def _client_call(node: ast.Call) -> str | None:
    """The client a call builds: `Consumer(...)`, or `clients.consumer(...)` /
    `self.clients.consumer(...)` through a `Clients`."""
    func = node.func
    if isinstance(func, ast.Name):
        return func.id if func.id in CLIENTS else None
    if isinstance(func, ast.Attribute) and func.attr in FACTORY:
        owner = func.value
        named = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
        return FACTORY[func.attr] if named == "clients" else None
    return None


def _is_builder(node: ast.expr, built: set[str]) -> bool:
    if isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
        return name in BUILDERS
    if isinstance(node, ast.Dict):  # {**connection_config(settings), ...}
        return any(
            k is None and _is_builder(v, built)
            for k, v in zip(node.keys, node.values, strict=False)
        )
    return isinstance(node, ast.Name) and node.id in built


def _violations(source: str, rel: str) -> list[str]:
    tree = ast.parse(source)
    found: list[str] = []
    for func in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.Module)]:
        built = {
            target.id
            for node in ast.walk(func)
            if isinstance(node, ast.Assign) and _is_builder(node.value, set())
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(func):
            if not isinstance(node, ast.Call):
                continue
            client = _client_call(node)
            if client is None or (rel, client) in EXEMPT:
                continue
            if not node.args or not _is_builder(node.args[0], built):
                found.append(f"{rel}:{node.lineno} {client}(...)")
    return sorted(set(found))  # a call inside a function is seen from the module too


def test_every_kafka_client_of_the_product_is_built_from_streams_kafka() -> None:
    product = ("streams", "connectors", "projections", "bench")
    files = [p for d in product for p in (ROOT / d).rglob("*.py")]
    assert len(files) > 50
    bad = sorted(
        {v for path in files for v in _violations(path.read_text(), str(path.relative_to(ROOT)))}
    )
    assert bad == [], "build Kafka clients with streams/kafka.py's functions: " + ", ".join(bad)


def test_the_check_sees_a_client_built_by_hand() -> None:
    by_hand = "def f(s):\n    return Consumer({'bootstrap.servers': s.kafka})\n"
    assert _violations(by_hand, "x.py") == ["x.py:2 Consumer(...)"]
    assert _violations("Producer(producer_config(s))", "x.py") == []
    assert _violations("def f(s):\n    c = admin_config(s)\n    AdminClient(c)\n", "x.py") == []
    assert _violations("Consumer({**connection_config(s), 'group.id': 'g'})", "x.py") == []
    # Through a loop's `Clients` too.
    through = "def f(self):\n    return self.clients.producer({'bootstrap.servers': 'x'})\n"
    assert _violations(through, "x.py") == ["x.py:2 Producer(...)"]
    assert _violations("clients.admin(admin_config(s))", "x.py") == []


def test_the_acl_table_in_docs_is_the_one_applied() -> None:
    """docs/security.md shows exactly the grants `cronlog stack up --secure` applies."""
    from connectors.stack.acls import table

    doc = (ROOT / "docs" / "security.md").read_text()
    shown = doc.split("<!-- acl-table -->\n", 1)[1].split("\n<!-- /acl-table -->", 1)[0]
    assert shown == table()


def test_group_consumers_use_the_kip_848_protocol_with_co_partitioning() -> None:
    # The broker holds the session (streams/groups.py); the client-side classic settings
    # would be ignored, and range is the broker assignor that co-partitions.
    config = consumer_config(Settings(), "cronlog.scheduler")
    assert config["group.protocol"] == "consumer"
    assert config["group.remote.assignor"] == "range"
    for classic in ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"):
        assert classic not in config


def test_every_client_learns_moved_leaders_within_the_budgets_refresh() -> None:
    # A client with nothing in flight to a paused broker must send its next request to the
    # new leader, not wait for a request to the old one to time out: the refresh is part
    # of the broker failover F the lease outlives (streams/core/timing.py).
    refresh_ms = int(TIMING.metadata_refresh_s * 1000)
    for config in (
        connection_config(Settings()),
        admin_config(Settings()),
        producer_config(Settings()),
        transactional_producer_config(Settings(), "t"),
        consumer_config(Settings(), "cronlog.ledger"),
        consumer_config(Settings(), None),
    ):
        assert config["topic.metadata.refresh.interval.ms"] == refresh_ms
        assert config["socket.timeout.ms"] == int(TIMING.request_timeout_s * 1000)
    assert refresh_ms < TIMING.request_timeout_s * 1000


def test_the_heartbeat_producer_sends_without_waiting_for_a_producer_id() -> None:
    # A replacement made mid-failover must beat at once, not wait for a producer id from a
    # coordinator that is moving; every beat still needs every in-sync replica, in order.
    config = producer_config(Settings(), **HEARTBEAT_PRODUCER)
    assert config["enable.idempotence"] is False
    assert config["acks"] == "all"
    assert config["max.in.flight.requests.per.connection"] == 1
    assert config["request.timeout.ms"] == config["socket.timeout.ms"] == TIMING.ack_window_s * 1000


def test_the_ledger_sends_a_transactions_records_at_its_commit() -> None:
    # Nothing the ledger produces is visible before its commit, whose flush sends what is
    # queued at once: lingering about a transaction's length saves the broker a request
    # every 5 ms while the transaction decides, and delays no record a reader could see.
    config = transactional_producer_config(Settings(), "t")
    assert config["linger.ms"] == TRANSACTION_LINGER_MS
    assert TRANSACTION_LINGER_MS >= 500
    assert producer_config(Settings())["linger.ms"] == 5
