"""Replication settings: CRONLOG_REPLICATION / CRONLOG_MIN_ISR, their defaults from the
cluster's size, and the local stack's broker count and port scheme."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.stack import StackPaths
from connectors.stack.kafka import KafkaStack, replication_for
from connectors.stack.process import StackError
from streams.settings import Settings, SettingsError
from streams.topics import TopicError, choose_replication, default_replication


def test_defaults_follow_the_cluster_size() -> None:
    assert default_replication(1).factor == 1
    assert default_replication(1).min_isr == 1
    assert default_replication(2).factor == 2
    assert (default_replication(3).factor, default_replication(3).min_isr) == (3, 2)
    assert (default_replication(5).factor, default_replication(5).min_isr) == (3, 2)


@given(st.integers(1, 12), st.integers(1, 12))
def test_a_chosen_replication_is_always_writable(live: int, broker_default: int) -> None:
    try:
        chosen = choose_replication(Settings(), live, broker_default)
    except TopicError:
        # Refused only when the cluster is known to be larger than what runs.
        assert broker_default > live
        return
    assert 1 <= chosen.min_isr <= chosen.factor <= live
    # One broker may fail without stopping writes once there are three copies.
    assert chosen.factor - chosen.min_isr >= (1 if chosen.factor >= 3 else 0)


def test_a_cluster_with_a_broker_down_is_not_silently_unreplicated() -> None:
    with pytest.raises(TopicError, match="needs 3 brokers but the cluster has 2"):
        choose_replication(Settings(), live_brokers=2, broker_default_factor=3)


def test_explicit_values_win_and_impossible_ones_are_refused() -> None:
    chosen = choose_replication(Settings(replication=2), 3)
    assert (chosen.factor, chosen.min_isr) == (2, 1)
    with pytest.raises(TopicError, match="CRONLOG_REPLICATION to at most 3"):
        choose_replication(Settings(replication=4), 3)
    with pytest.raises(TopicError, match="CRONLOG_MIN_ISR is 4"):
        choose_replication(Settings(min_isr=4), 3)


def test_settings_read_the_environment() -> None:
    s = Settings.from_env({"CRONLOG_REPLICATION": "3", "CRONLOG_MIN_ISR": "2"})
    assert (s.replication, s.min_isr) == (3, 2)
    assert Settings.from_env({}).replication is None
    with pytest.raises(SettingsError, match="CRONLOG_REPLICATION must be an integer"):
        Settings.from_env({"CRONLOG_REPLICATION": "three"})
    with pytest.raises(SettingsError, match="cannot exceed"):
        Settings.from_env({"CRONLOG_REPLICATION": "1", "CRONLOG_MIN_ISR": "2"})
    with pytest.raises(SettingsError, match="between 1 and"):
        Settings.from_env({"CRONLOG_MIN_ISR": "0"})


def test_stack_ports_step_by_two_and_the_internal_topics_are_replicated(tmp_path: Path) -> None:
    stack = KafkaStack(StackPaths(tmp_path), 9092, 9093, brokers=3)
    assert stack.bootstrap == "127.0.0.1:9092,127.0.0.1:9094,127.0.0.1:9096"
    assert [n.controller_port for n in stack.nodes] == [9093, 9095, 9097]
    assert [n.dir.name for n in stack.nodes] == ["node-1", "node-2", "node-3"]
    assert replication_for(3) == (3, 2)
    assert replication_for(1) == (1, 1)
    one = KafkaStack(StackPaths(tmp_path / "one"))
    assert one.bootstrap == "127.0.0.1:9092"
    assert one.nodes[0].dir == tmp_path / "one" / "kafka"
    with pytest.raises(StackError, match="overlap"):
        KafkaStack(StackPaths(tmp_path), 9092, 9094, brokers=3)


def test_the_broker_count_of_a_state_folder_is_fixed(tmp_path: Path) -> None:
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / "cluster.json").write_text(json.dumps({"brokers": 3, "cluster_id": "x"}))
    assert KafkaStack(StackPaths(tmp_path)).brokers == 3  # no flag: what it holds
    with pytest.raises(StackError, match="holds a 3-broker Kafka cluster"):
        KafkaStack(StackPaths(tmp_path), brokers=1).check_count()
    legacy = tmp_path / "legacy"
    (legacy / "kafka" / "data").mkdir(parents=True)
    (legacy / "kafka" / "data" / "meta.properties").write_text("")
    assert KafkaStack(StackPaths(legacy)).brokers == 1
    with pytest.raises(StackError, match="holds a 1-broker"):
        KafkaStack(StackPaths(legacy), brokers=3).check_count()
