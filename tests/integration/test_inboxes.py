"""Private inboxes on the real broker (streams/inboxes.py): a worker id without its own
inbox topic is routed to the shared one; once the worker has made its topic (one
partition, the inbox's retention), every router sends its messages there, at the latest
after the negative answer it cached has expired; an id that cannot name a topic is
refused with the rule."""

from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from streams.inboxes import MISS_TTL_S, Inboxes, ensure_private_inbox, private_inbox
from streams.kafka import admin_config
from streams.settings import Settings


def test_a_worker_gets_its_own_inbox_once_it_has_made_it(topics: Settings) -> None:
    router = Inboxes(topics)
    shared = topics.topic("worker-inbox")
    assert router.topic("inbox-w1") == shared  # no topic yet: the shared inbox
    assert router.topic("an id with spaces") == shared  # cannot name one: shared

    assert ensure_private_inbox(topics, "inbox-w1") is True
    assert ensure_private_inbox(topics, "inbox-w1") is False  # made once
    own = private_inbox(topics, "inbox-w1")
    assert own == f"{shared}.inbox-w1"
    admin = AdminClient(admin_config(topics))
    assert len(admin.list_topics(own, timeout=10).topics[own].partitions) == 1
    (config,) = admin.describe_configs([ConfigResource("topic", own)]).values()
    assert config.result()["retention.ms"].value == str(24 * 3600 * 1000)

    # A fresh router sees it at once; the one that cached the miss within MISS_TTL_S
    # (the wait a worker makes after creating its inbox, before its first heartbeat).
    assert Inboxes(topics).topic("inbox-w1") == own
    time.sleep(MISS_TTL_S + 0.1)
    assert router.topic("inbox-w1") == own
    assert router.topic("inbox-w2") == shared

    with pytest.raises(ValueError, match="letters, digits"):
        ensure_private_inbox(topics, "w/1")
