"""Time zones from the `tzdata` package pinned with cronlog, never from the host.

Every node must compute the same fire times, so every process, whichever way it was
started (the `cronlog` command, a spawned multiprocessing child such as the scheduler
node's ledger, a test, a benchmark), reads zone data from the one tz database installed
with cronlog. `load_zone` opens the package's files directly: neither the host's
/usr/share/zoneinfo, nor PYTHONTZPATH, nor `zoneinfo.reset_tzpath` can change what it
returns.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, reset_tzpath

import tzdata  # type: ignore[import-untyped]

TZDATA_VERSION: Final[str] = tzdata.IANA_VERSION  # the tz database release, e.g. "2025b"

__all__ = ["TZDATA_VERSION", "load_zone", "use_tzdata_only", "zone_names"]


@lru_cache(maxsize=1)
def zone_names() -> frozenset[str]:
    """Every zone key the pinned package holds (its `zones` list, links included)."""
    listing = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8")
    return frozenset(listing.split())


def load_zone(name: str) -> ZoneInfo:
    """The zone `name` from the pinned tzdata package; ZoneInfoNotFoundError when the
    package has no such zone. Not cached: callers keep what they load."""
    if name not in zone_names():
        raise ZoneInfoNotFoundError(f"no time zone {name!r} in tzdata {TZDATA_VERSION}")
    resource = resources.files("tzdata.zoneinfo")
    for part in name.split("/"):
        resource = resource.joinpath(part)
    with resource.open("rb") as data:
        return ZoneInfo.from_file(data, key=name)


def use_tzdata_only() -> None:
    """Make plain `ZoneInfo(key)` in this process fall back to the tzdata package too (an
    empty search path), for code that does not go through `load_zone`. Zones that
    `ZoneInfo` already cached are not reloaded: call it first thing."""
    reset_tzpath(to=[])
