"""Fixtures shared by every tier.

Integration tests share one real broker and one PostgreSQL (see tests/support/services.py)
and isolate themselves: each test module gets its own topic prefix (and so its own
consumer groups) and its own database, both removed afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import hypothesis
import pytest

from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.isolation import (
    create_database,
    delete_topics_with_prefix,
    drop_database,
    unique_name,
)
from tests.support.long import LONG_TESTS
from tests.support.services import Services, real_services

# The tiers, by folder: a test's folder says what it needs, and sets its marker.
TIERS = {
    "unit": None,  # pure: CPU only, no clock, process or service
    "processes": "processes",  # real processes, clocks and sockets; no broker or database
    "integration": "integration",  # the real broker and PostgreSQL of the local stack
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test by its tier's folder. Long fault scenarios (marked `long`) run under
    `make chaos`; `make test` keeps the suite within its budget with their short versions."""
    skip = pytest.mark.skip(reason="long fault scenario: `make chaos` runs it")
    for item in items:
        parts = item.path.parts
        tier = parts[parts.index("tests") + 1] if "tests" in parts else None
        marker = TIERS.get(tier or "")
        if marker:
            item.add_marker(marker)
        if not LONG_TESTS and "long" in item.keywords:
            item.add_marker(skip)


# No per-example deadline: properties are about results, never about speed (benchmarks
# measure speed), and `make test` runs the pure unit tests niced beside the integration
# tests, where an example may wait for a core.
hypothesis.settings.register_profile("cronlog", deadline=None)
hypothesis.settings.load_profile("cronlog")

# Few partitions keep the shared broker light; the code never assumes a count.
TEST_PARTITIONS = 3


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    with real_services() as found:
        yield found


@pytest.fixture(scope="module")
def settings(services: Services, request: pytest.FixtureRequest) -> Iterator[Settings]:
    """Settings for one test module: its own topic prefix and database, torn down after."""
    name = unique_name(request.module.__name__)
    database_url, kind = create_database(services.database_url, name)
    module_settings = Settings(
        kafka=services.kafka,
        database_url=database_url,
        topic_prefix=f"{name}.",
        partitions=TEST_PARTITIONS,
    )
    if services.secured is not None:  # CRONLOG_TEST_SECURE=1: the roles' ACLs, as admin
        services.secured.grant(module_settings.topic_prefix)
        module_settings = services.secured.settings("admin", module_settings)
    yield module_settings
    delete_topics_with_prefix(module_settings, module_settings.topic_prefix)
    drop_database(services.database_url, name, kind)


@pytest.fixture(scope="module")
def topics(settings: Settings) -> Settings:
    """The module's settings with every contract topic created under its prefix."""
    ensure_topics(settings)
    return settings
