from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streams.core.placement import WorkerLimits
from streams.settings import (
    DEFAULT_DATABASE_URL,
    DEFAULT_KAFKA,
    DEFAULT_PARTITIONS,
    DEFAULT_TOPIC_PREFIX,
    Settings,
    SettingsError,
)


def test_defaults_are_the_contracts() -> None:
    settings = Settings.from_env({})
    assert settings == Settings(DEFAULT_KAFKA, DEFAULT_DATABASE_URL, DEFAULT_TOPIC_PREFIX, 12)
    assert settings.kafka == "localhost:9092"
    assert settings.topic_prefix == "cronlog."
    assert DEFAULT_PARTITIONS == 12


def test_environment_overrides_every_field() -> None:
    settings = Settings.from_env(
        {
            "CRONLOG_KAFKA": "k1:9092,k2:9092",
            "CRONLOG_DATABASE_URL": "postgresql://u:p@db/x",
            "CRONLOG_TOPIC_PREFIX": "prod-eu.",
            "CRONLOG_PARTITIONS": "24",
        }
    )
    assert settings == Settings("k1:9092,k2:9092", "postgresql://u:p@db/x", "prod-eu.", 24)
    assert settings.topic("job-log") == "prod-eu.job-log"
    assert settings.group("ledger") == "prod-eu.ledger"


@pytest.mark.parametrize("raw", ["0", "-3", "1025", "twelve", "1.5", ""])
def test_bad_partition_counts_are_refused_with_the_variable_named(raw: str) -> None:
    with pytest.raises(SettingsError, match="CRONLOG_PARTITIONS"):
        Settings.from_env({"CRONLOG_PARTITIONS": raw})


@pytest.mark.parametrize("prefix", ["a b.", "x/y.", "ü.", "semi;colon"])
def test_prefixes_that_kafka_would_reject_are_refused(prefix: str) -> None:
    with pytest.raises(SettingsError, match="CRONLOG_TOPIC_PREFIX"):
        Settings.from_env({"CRONLOG_TOPIC_PREFIX": prefix})


@given(st.text(alphabet="abcXYZ019._-", max_size=40), st.integers(1, 1024))
def test_any_legal_prefix_and_count_round_trips(prefix: str, partitions: int) -> None:
    settings = Settings.from_env(
        {"CRONLOG_TOPIC_PREFIX": prefix, "CRONLOG_PARTITIONS": str(partitions)}
    )
    assert settings.topic_prefix == prefix
    assert settings.partitions == partitions
    assert settings.with_(partitions=1).partitions == 1


def test_with_validates_the_copy() -> None:
    with pytest.raises(SettingsError):
        Settings().with_(partitions=0)


def test_worker_limits_are_read_from_the_environment_and_unbounded_by_default() -> None:
    assert Settings.from_env({}).worker_limits == WorkerLimits()
    limits = Settings.from_env(
        {
            "CRONLOG_WORKER_MAX_CPU": "8.5",
            "CRONLOG_WORKER_MAX_MEMORY_MB": "16384",
            "CRONLOG_WORKER_MAX_GPU": "0",
            "CRONLOG_WORKER_LABELS": "zone=*, os=linux,",
        }
    ).worker_limits
    assert limits == WorkerLimits(8.5, 16384, 0, frozenset({"zone=*", "os=linux"}))


@pytest.mark.parametrize(
    ("name", "raw", "says"),
    [
        ("CRONLOG_WORKER_MAX_CPU", "lots", "must be a number"),
        ("CRONLOG_WORKER_MAX_CPU", "-1", "finite number >= 0"),
        ("CRONLOG_WORKER_MAX_CPU", "inf", "finite number >= 0"),
        ("CRONLOG_WORKER_MAX_CPU", "nan", "finite number >= 0"),
        ("CRONLOG_WORKER_MAX_MEMORY_MB", "1.5", "must be an integer"),
        ("CRONLOG_WORKER_MAX_GPU", "-2", "must be >= 0"),
        ("CRONLOG_WORKER_LABELS", "zone", "expected key=value or key=*"),
        ("CRONLOG_WORKER_LABELS", "zone=a,=b", "expected key=value or key=*"),
    ],
)
def test_bad_worker_limits_are_refused_with_the_variable_named(
    name: str, raw: str, says: str
) -> None:
    with pytest.raises(SettingsError, match=name) as refused:
        Settings.from_env({name: raw})
    assert says in str(refused.value)
