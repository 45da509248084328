"""Time zones come from the pinned tzdata package in every process (streams.core.zones),
also in a child started with multiprocessing's spawn as the node starts its
ledger: a host zone directory (here a fake one on PYTHONTZPATH, whose Europe/Berlin is
really Asia/Tokyo and which has a zone tzdata does not know) changes nothing."""

from __future__ import annotations

import multiprocessing
import shutil
import zoneinfo
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import tzdata  # type: ignore[import-untyped]

from schemas.spec import CronSchedule
from streams.core.schedule import ScheduleError, next_fire, parse_schedule
from streams.core.zones import TZDATA_VERSION, load_zone, use_tzdata_only, zone_names

JAN_1_2026_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
NOON_BERLIN_MS = JAN_1_2026_MS + 11 * 3_600_000  # 12:00 CET = 11:00 UTC


@pytest.fixture
def host_zones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A zone directory that lies: Europe/Berlin is Tokyo's data, Fake/Zone exists."""
    package = Path(tzdata.__file__).parent / "zoneinfo"
    (tmp_path / "Europe").mkdir()
    (tmp_path / "Fake").mkdir()
    shutil.copy(package / "Asia" / "Tokyo", tmp_path / "Europe" / "Berlin")
    shutil.copy(package / "UTC", tmp_path / "Fake" / "Zone")
    monkeypatch.setenv("PYTHONTZPATH", str(tmp_path))  # read by zoneinfo at import
    return tmp_path


def lookups() -> dict[str, Any]:
    """What a fresh process sees: the first noon of 2026 on a Berlin cron job, whether
    the fake zone is accepted, and where plain ZoneInfo would have looked."""
    berlin = CronSchedule("0 12 * * *", "Europe/Berlin")
    try:
        parse_schedule({"cron": "0 12 * * *", "timezone": "Fake/Zone"})
        fake = "accepted"
    except ScheduleError:
        fake = "refused"
    return {
        "noon": next_fire(berlin, JAN_1_2026_MS),
        "fake": fake,
        "tzpath": list(zoneinfo.TZPATH),
        "version": TZDATA_VERSION,
    }


def test_a_spawned_child_reads_zones_from_the_tzdata_package(host_zones: Path) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        seen = pool.apply(lookups)
    assert seen["tzpath"] == [str(host_zones)]  # plain ZoneInfo would read the fake files
    assert seen["noon"] == NOON_BERLIN_MS, "Europe/Berlin came from the host's files"
    assert seen["fake"] == "refused"
    assert seen["version"] == tzdata.IANA_VERSION


def test_load_zone_ignores_the_search_path(host_zones: Path) -> None:
    saved = zoneinfo.TZPATH
    zoneinfo.reset_tzpath(to=[str(host_zones)])
    try:
        assert _offset(zoneinfo.ZoneInfo.no_cache("Europe/Berlin")) == timedelta(hours=9)
        assert _offset(load_zone("Europe/Berlin")) == timedelta(hours=1)
        with pytest.raises(zoneinfo.ZoneInfoNotFoundError):
            load_zone("Fake/Zone")
        use_tzdata_only()  # what `cronlog` does first: plain ZoneInfo too, then
        assert _offset(zoneinfo.ZoneInfo.no_cache("Europe/Berlin")) == timedelta(hours=1)
    finally:
        zoneinfo.reset_tzpath(to=saved)


def _offset(zone: zoneinfo.ZoneInfo) -> timedelta | None:
    return datetime.fromtimestamp(JAN_1_2026_MS / 1000, UTC).astimezone(zone).utcoffset()


@pytest.mark.parametrize("name", ["localtime", "posixrules", "../etc/passwd", "Europe", "", "/"])
def test_names_the_package_does_not_list_are_unknown(name: str) -> None:
    with pytest.raises(zoneinfo.ZoneInfoNotFoundError):
        load_zone(name)


def test_the_package_lists_the_usual_zones() -> None:
    assert {"UTC", "Etc/UTC", "Europe/Berlin", "US/Eastern"} <= zone_names()
    assert TZDATA_VERSION == tzdata.IANA_VERSION
    assert str(load_zone("US/Eastern")) == "US/Eastern"
    assert next_fire(CronSchedule("0 12 * * *", "Europe/Berlin"), JAN_1_2026_MS) == NOON_BERLIN_MS
