from __future__ import annotations

from streams.topics import CATALOGUE, FOREVER, NAMES

# docs/architecture.md, "Topics": the names users and outside tests rely on.
CONTRACT = {
    "commands",
    "commands.dlq",
    "job-log",
    "run-events",
    "jobs",
    "runs",
    "dispatch",
    "heartbeats",
    "worker-inbox",
    "run-logs",
    "notifications.dlq",  # the notifier's dead letters (issue 15)
    "worker-reports",  # what workers write, apart from registrations (issue 16)
    "worker-handbacks",  # assignments released: workers never write dispatch (issue 16)
    "node-keys",  # the nodes' placement key for sealing assignments (issue 16)
}


def test_catalogue_is_exactly_the_contract() -> None:
    assert set(NAMES) == CONTRACT
    assert len(NAMES) == len(CONTRACT)


def test_ledger_state_topics_and_the_key_are_compacted_and_nothing_else_is() -> None:
    compacted = {s.name for s in CATALOGUE if s.config.get("cleanup.policy") == "compact"}
    # node-keys too: keyed by writer, so compaction keeps its first record, the key.
    assert compacted == {"jobs", "runs", "node-keys"}


def test_audit_and_input_logs_keep_long_history() -> None:
    retention = {
        s.name: int(s.config["retention.ms"]) for s in CATALOGUE if "retention.ms" in s.config
    }
    assert retention["run-events"] == FOREVER
    assert retention["job-log"] >= 30 * 24 * 3600 * 1000
    # Everything that is not kept forever keeps at least a day.
    assert all(ms == FOREVER or ms >= 24 * 3600 * 1000 for ms in retention.values())
