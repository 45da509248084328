"""JSON views of the records (orjson), for the CLI, logs and dead-letter envelopes.

A record is a JSON object of its fields plus "type" (the class name); env and labels are
objects, and a schedule is {"cron": expr, "timezone": tz}, {"every_ms": n}, {"at_ms": n}
or null. `from_json(to_json(x)) == x` for every record class of schemas.records and
for JobSpec.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import orjson

from schemas.convert import AT, CONVERTERS, CRON, EVERY, AvroDict, Named

_BY_NAME: dict[str, type[Any]] = {cls.__name__: cls for cls in CONVERTERS}


def _schedule_to_json(value: Named | None) -> AvroDict | None:
    if value is None:
        return None
    name, d = value
    bounds = {k: d[k] for k in ("start_ms", "end_ms") if d.get(k) is not None}
    if name == CRON:
        return {"cron": d["expr"], "timezone": d["timezone"], **bounds}
    if name == EVERY:
        return {"every_ms": d["every_ms"], **bounds}
    return dict(d)  # {"at_ms": n}


def _schedule_from_json(value: Any) -> Named | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"schedule must be an object or null, not {value!r}")
    bounds = {"start_ms": value.get("start_ms"), "end_ms": value.get("end_ms")}
    if "cron" in value:
        return CRON, {"expr": value["cron"], "timezone": value.get("timezone", "UTC"), **bounds}
    if "every_ms" in value:
        return EVERY, {"every_ms": value["every_ms"], **bounds}
    if "at_ms" in value:
        return AT, {"at_ms": value["at_ms"]}
    raise ValueError(f"unknown schedule {value!r}")


def _map_spec(d: AvroDict, convert: Any) -> AvroDict:
    """`d` with the schedule of its spec (or of itself, for a JobSpec) converted."""
    if "schedule" in d:
        return {**d, "schedule": convert(d["schedule"])}
    spec = d.get("spec")
    if spec is not None:
        return {**d, "spec": {**spec, "schedule": convert(spec["schedule"])}}
    return d


def to_plain(record: Any) -> AvroDict:
    """`record` as a dict of JSON values (see the module doc)."""
    try:
        _, to_avro, _ = CONVERTERS[type(record)]
    except KeyError:
        raise TypeError(f"no JSON form for {type(record).__name__}") from None
    return {"type": type(record).__name__, **_map_spec(to_avro(record), _schedule_to_json)}


def to_json(record: Any) -> bytes:
    return orjson.dumps(to_plain(record))


def from_plain(obj: AvroDict, cls: type[Any] | None = None) -> Any:
    """The record `to_plain` made; `cls` is needed when `obj` has no "type"."""
    name = obj.get("type")
    if cls is None:
        if name not in _BY_NAME:
            raise ValueError(f"unknown or missing record type {name!r}")
        cls = _BY_NAME[name]
    elif name is not None and name != cls.__name__:
        raise ValueError(f"expected a {cls.__name__}, got a {name}")
    _, _, from_avro = CONVERTERS[cls]
    fields = {k: v for k, v in obj.items() if k != "type"}
    try:
        return from_avro(_map_spec(fields, _schedule_from_json))
    except (KeyError, TypeError) as err:
        raise ValueError(f"not a {cls.__name__}: {type(err).__name__}: {err}") from err


def from_json(data: bytes | str, cls: type[Any] | None = None) -> Any:
    obj = orjson.loads(data)
    if not isinstance(obj, dict):
        raise ValueError("a record must be a JSON object")
    return from_plain(obj, cls)


# -- dead letters -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class DeadLetter:
    original: bytes
    reason: str
    topic: str
    partition: int
    offset: int


def dlq_record(original: bytes, reason: str, topic: str, partition: int, offset: int) -> bytes:
    """The JSON envelope of a rejected record: why, where it came from, and its bytes
    (base64, since they need not be text)."""
    return orjson.dumps(
        {
            "reason": reason,
            "topic": topic,
            "partition": partition,
            "offset": offset,
            "original_base64": base64.b64encode(original).decode("ascii"),
        }
    )


def read_dlq_record(data: bytes) -> DeadLetter:
    obj = orjson.loads(data)
    return DeadLetter(
        original=base64.b64decode(obj["original_base64"], validate=True),
        reason=obj["reason"],
        topic=obj["topic"],
        partition=obj["partition"],
        offset=obj["offset"],
    )
