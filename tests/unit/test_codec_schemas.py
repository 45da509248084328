"""The schema files: consistent with the dataclasses, every version kept, every old version
readable by the current one, and schema evolution working end to end (on a copy)."""

from __future__ import annotations

import io
import random
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any, get_args, get_type_hints

import orjson
import pytest
from fastavro import schemaless_writer
from fastavro.utils import generate_many

from schemas.codec import JOB_LOG, JOB_STATE, RUN_STATE, Codec, CodecError
from schemas.compat import problems
from schemas.convert import (
    CONVERTERS,
    LEDGER_CLASSES,
    job_state_from_avro,
    job_state_to_avro,
    run_state_from_avro,
    run_state_to_avro,
)
from schemas.records import (
    DeadlineKind,
    DispatchRequest,
    JobEvent,
    JobState,
    JobUpserted,
    RunState,
    RunStateName,
    Trigger,
)
from schemas.registry import (
    AVRO_DIR,
    TOPIC_SCHEMAS,
    SchemaError,
    TopicSchema,
    current_schemas,
    history_files,
    load_all,
    shipped,
    snapshot,
)
from schemas.spec import (
    CONCURRENCY_POLICIES,
    DST_POLICIES,
    MISFIRE_POLICIES,
    AtSchedule,
    CronSchedule,
    EverySchedule,
    JobSpec,
    Resources,
    RetryPolicy,
)

SCHEMAS = shipped()
NAMES = sorted(TOPIC_SCHEMAS)
HISTORY = [(name, v.version) for name in NAMES for v in SCHEMAS[name].versions]


def named_types() -> dict[str, Any]:
    """Every named type of every current schema, by short name (fastavro-parsed)."""
    out: dict[str, Any] = {}
    for topic_schema in SCHEMAS.values():
        for name, schema in topic_schema.current.parsed["__named_schemas"].items():
            out[name.rpartition(".")[2]] = schema
    return out


def record_fields(schema: Any) -> list[str]:
    return [f["name"] for f in schema["fields"]]


# -- the files agree with the dataclasses ---------------------------------------------------
@pytest.mark.parametrize(
    "cls",
    [
        *CONVERTERS,
        Resources,
        RetryPolicy,
        CronSchedule,
        EverySchedule,
        AtSchedule,
    ],
    ids=lambda cls: cls.__name__,
)
def test_avro_records_have_the_fields_of_their_dataclass(cls: type[Any]) -> None:
    schema = named_types()[cls.__name__]
    assert record_fields(schema) == [f.name for f in fields(cls)]


@pytest.mark.parametrize(
    ("enum", "symbols"),
    [
        ("Trigger", get_args(Trigger)),
        ("RunStateName", get_args(RunStateName)),
        ("DeadlineKind", get_args(DeadlineKind)),
        ("MisfirePolicy", MISFIRE_POLICIES),
        ("ConcurrencyPolicy", CONCURRENCY_POLICIES),
        ("DstPolicy", DST_POLICIES),
        ("JobEventKind", get_args(get_type_hints(JobEvent)["kind"])),
    ],
)
def test_enums_have_the_symbols_of_their_literal(enum: str, symbols: Any) -> None:
    assert tuple(named_types()[enum]["symbols"]) == tuple(symbols)


def test_the_job_log_union_has_one_branch_per_ledger_input() -> None:
    branches = SCHEMAS["job_log"].current.parsed["fields"][0]["type"]
    assert [b["name"] for b in branches] == [f"dev.cronlog.{c.__name__}" for c in LEDGER_CLASSES]
    events = SCHEMAS["run_event"].current.parsed["fields"][0]["type"]
    assert [b["name"] for b in events] == ["dev.cronlog.RunEvent", "dev.cronlog.JobEvent"]


def test_state_and_dispatch_topics_hold_their_record_directly() -> None:
    for name, cls in (
        ("job_state", JobState),
        ("run_state", RunState),
        ("dispatch", DispatchRequest),
    ):
        assert SCHEMAS[name].current.parsed["name"] == f"dev.cronlog.{cls.__name__}"


def test_times_are_plain_longs_named_ms() -> None:
    def walk(schema: Any) -> None:
        if isinstance(schema, list):
            for branch in schema:
                walk(branch)
        elif isinstance(schema, dict):
            assert "logicalType" not in schema
            for f in schema.get("fields", ()):
                if f["name"].endswith("_ms"):
                    assert f["type"] in ("long", ["null", "long"]), f["name"]
                walk(f["type"])
            for key in ("items", "values"):
                if key in schema:
                    walk(schema[key])

    for topic_schema in SCHEMAS.values():
        walk(topic_schema.current.schema)


def test_nullable_fields_default_to_null() -> None:
    for topic_schema in SCHEMAS.values():
        for schema in topic_schema.current.parsed["__named_schemas"].values():
            for f in schema.get("fields", ()):
                if isinstance(f["type"], list) and "null" in f["type"]:
                    assert f["type"][0] == "null", f["name"]
                    assert f.get("default", "missing") is None, f["name"]


# -- versions ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_current_schema_is_the_newest_history_version(name: str) -> None:
    history = history_files(name)
    assert history, f"no history/{name}.v1.avsc"
    newest = orjson.loads(history[-1][1].read_bytes())
    assert newest == current_schemas()[name], (
        f"{name}.avsc changed: run `python -m schemas.registry snapshot` to add "
        f"history/{name}.v{len(history) + 1}.avsc"
    )
    assert SCHEMAS[name].current.version == len(history)


@pytest.mark.parametrize(("name", "version"), HISTORY)
def test_current_schema_reads_every_history_version(name: str, version: int) -> None:
    topic_schema = SCHEMAS[name]
    old = topic_schema.versions[version - 1]
    current = topic_schema.current
    # Structurally, by the resolution rules...
    assert problems(old.schema, current.schema) == []
    # ...and by fastavro: samples written with the old version, read with the codec.
    codec = codec_for(name)
    random.seed(version)
    for sample in generate_many(old.schema, 25):
        data = write(old.header, old.parsed, sample)
        assert codec.version_of(data) is old
        codec.decode_avro(data)


def test_history_is_self_contained_and_numbered_from_one() -> None:
    for name in NAMES:
        versions = history_files(name)
        assert [v for v, _ in versions] == list(range(1, len(versions) + 1))
        for _, path in versions:
            text = path.read_bytes()
            assert b'"type":"record"' in text.replace(b" ", b"")


def test_package_ships_only_known_schema_files() -> None:
    stems = {p.stem for p in AVRO_DIR.glob("*.avsc")}
    assert stems == {*TOPIC_SCHEMAS, "common"}


def codec_for(name: str) -> Codec[Any]:
    from schemas import codec

    return {c.schema.name: c for c in codec.BY_TOPIC.values()}[name]


def write(header: bytes, parsed: Any, datum: Any) -> bytes:
    buffer = io.BytesIO()
    buffer.write(header)
    schemaless_writer(buffer, parsed, datum)
    return buffer.getvalue()


# -- evolution, on a copy of the schema files -----------------------------------------------
@pytest.fixture
def avro_copy(tmp_path: Path) -> Path:
    target = tmp_path / "avro"
    shutil.copytree(AVRO_DIR, target)
    return target


def edit(path: Path, change: Any) -> None:
    schema = orjson.loads(path.read_bytes())
    change(schema)
    path.write_bytes(orjson.dumps(schema, option=orjson.OPT_INDENT_2))


def common_type(schema: list[Any], name: str) -> Any:
    return next(t for t in schema if t["name"] == name)


def evolve(avro: Path) -> dict[str, TopicSchema]:
    """A compatible next version: a new RunState field with a default, a new DeadlineKind
    symbol, and a new JobSpec field with a default (which changes every schema that
    holds a JobSpec); then the snapshot that registers them as v2."""

    def run_state(schema: Any) -> None:
        schema["fields"].append({"name": "queue", "type": "string", "default": "default"})

    def common(schema: Any) -> None:
        common_type(schema, "DeadlineKind")["symbols"].append("lease")
        common_type(schema, "JobSpec")["fields"].append(
            {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []}
        )

    before = load_all(avro)
    edit(avro / "run_state.avsc", run_state)
    edit(avro / "common.avsc", common)
    written = snapshot(avro)
    changed = ("job_log", "job_state", "run_event", "run_state")
    assert sorted(p.name for p in written) == [
        f"{name}.v{before[name].current.version + 1}.avsc" for name in changed
    ]
    assert snapshot(avro) == []  # nothing more to register
    return load_all(avro)


def test_an_evolved_schema_reads_records_written_with_the_shipped_one(avro_copy: Path) -> None:
    evolved = evolve(avro_copy)
    new_runs = Codec(evolved["run_state"], run_state_to_avro, run_state_from_avro)
    shipped = RUN_STATE.current.version
    assert new_runs.current.version == shipped + 1
    assert [v.version for v in evolved["run_state"].versions] == list(range(1, shipped + 2))
    old = evolved["run_state"].versions[shipped - 1]
    assert old.fingerprint == RUN_STATE.current.fingerprint
    assert new_runs.current.fingerprint != old.fingerprint
    assert problems(old.schema, new_runs.current.schema) == []

    record = RunState(
        run_id="r@1",
        job_id="j",
        scheduled_ms=1_000,
        trigger="schedule",
        state="retrying",
        attempt=2,
        worker_id="",
        created_ms=900,
        updated_ms=950,
        deadline_ms=2_000,
        deadline_kind="retry",
        started_ms=None,
        finished_ms=None,
        exit_code=1,
        reason="exit 1",
        seq=4,
    )
    data = RUN_STATE.encode(record)  # written by today's code
    assert new_runs.version_of(data).version == shipped
    assert new_runs.decode_avro(data)["queue"] == "default"  # the new field's default
    assert new_runs.decode(data) == record

    # A JobSpec inside the job log gains `tags` = [] the same way.
    new_log = Codec(evolved["job_log"], JOB_LOG.to_avro, JOB_LOG.from_avro)
    upsert = JobUpserted(JobSpec("j", "o", EverySchedule(60_000), ("true",)), 5)
    assert new_log.decode_avro(JOB_LOG.encode(upsert))["body"][1]["spec"]["tags"] == []
    assert new_log.decode(JOB_LOG.encode(upsert)) == upsert
    new_states = Codec(evolved["job_state"], job_state_to_avro, job_state_from_avro)
    assert (
        new_states.version_of(new_states.encode(_state(upsert.spec))).version
        == JOB_STATE.current.version + 1
    )

    # Today's code refuses the newer version loudly instead of misreading it.
    newer = new_runs.encode(record)
    with pytest.raises(CodecError, match="unknown schema fingerprint"):
        RUN_STATE.decode(newer)


def _state(spec: JobSpec) -> JobState:
    return JobState(
        spec=spec,
        paused=False,
        deleted=False,
        created_ms=0,
        updated_ms=0,
        fired_ms=0,
        next_due_ms=None,
        live_runs=(),
        final_runs=(),
        recent_requests=(),
        version=0,
    )


INCOMPATIBLE = {
    "a new field without a default": lambda s: s["fields"].append(
        {"name": "queue", "type": "string"}
    ),
    "a long becoming a string": lambda s: next(
        f for f in s["fields"] if f["name"] == "attempt"
    ).update(type="string"),
    "a nullable field becoming required": lambda s: next(
        f for f in s["fields"] if f["name"] == "exit_code"
    ).update(type="long", default=0),
    "a renamed record": lambda s: s.update(name="RunStatus"),
}


@pytest.mark.parametrize("change", sorted(INCOMPATIBLE))
def test_incompatible_changes_are_caught(avro_copy: Path, change: str) -> None:
    edit(avro_copy / "run_state.avsc", INCOMPATIBLE[change])
    snapshot(avro_copy)
    runs = load_all(avro_copy)["run_state"]
    old, new = runs.versions[-2:]
    assert problems(old.schema, new.schema) != []
    # fastavro's resolution agrees: a record written with v1 does not read as v2.
    data = write(old.header, old.parsed, run_state_to_avro(_run()))
    with pytest.raises(CodecError):
        Codec(runs, run_state_to_avro, run_state_from_avro).decode_avro(data)


def test_a_removed_enum_symbol_is_caught(avro_copy: Path) -> None:
    edit(avro_copy / "common.avsc", lambda s: common_type(s, "DeadlineKind")["symbols"].pop())
    snapshot(avro_copy)
    runs = load_all(avro_copy)["run_state"]
    old, new = runs.versions[-2:]
    found = problems(old.schema, new.schema)
    # (the checker reports it where the enum is met: the union of run_state's deadline_kind)
    assert any("ENUM" in p or "dependency" in p for p in found), found


@pytest.mark.parametrize(
    ("writer", "reader", "ok"),
    [
        ("int", "long", True),
        ("long", "double", True),
        ("long", "int", False),
        ("string", "bytes", True),
        (["null", "long"], ["null", "long", "string"], True),
        (["null", "long", "string"], ["null", "long"], False),
        ("long", ["null", "long"], True),
        ({"type": "array", "items": "int"}, {"type": "array", "items": "long"}, True),
        ({"type": "map", "values": "long"}, {"type": "map", "values": "int"}, False),
    ],
)
def test_compat_checker_follows_the_promotion_rules(writer: Any, reader: Any, ok: bool) -> None:
    w = {"type": "record", "name": "R", "fields": [{"name": "x", "type": writer}]}
    r = {"type": "record", "name": "R", "fields": [{"name": "x", "type": reader}]}
    assert (problems(w, r) == []) is ok


def test_a_type_defined_twice_is_refused(avro_copy: Path) -> None:
    def define_resources_again(schema: Any) -> None:
        schema["fields"].append(
            {
                "name": "extra",
                "type": common_type(
                    orjson.loads((avro_copy / "common.avsc").read_bytes()), "Resources"
                ),
            }
        )

    edit(avro_copy / "dispatch.avsc", define_resources_again)
    with pytest.raises(SchemaError, match="Resources defined twice"):
        current_schemas(avro_copy)


def test_an_unknown_type_is_refused(avro_copy: Path) -> None:
    edit(avro_copy / "dispatch.avsc", lambda s: s["fields"].append({"name": "x", "type": "Nope"}))
    with pytest.raises(SchemaError, match="unknown type 'Nope'"):
        current_schemas(avro_copy)


def _run() -> RunState:
    return RunState(
        run_id="r@1",
        job_id="j",
        scheduled_ms=1_000,
        trigger="schedule",
        state="cancelled",
        attempt=1,
        worker_id="w1",
        created_ms=900,
        updated_ms=990,
        deadline_ms=None,
        deadline_kind=None,
        started_ms=950,
        finished_ms=990,
        exit_code=None,  # killed: the branch a required exit_code cannot read
        reason="cancelled by user",
        seq=5,
    )
