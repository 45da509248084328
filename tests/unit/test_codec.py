"""Codecs of every topic: round trips, the single-object header, bad bytes, JSON views."""

from __future__ import annotations

import contextlib
import dataclasses
import io
from dataclasses import fields, replace
from typing import Any, get_args

import orjson
import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, to_parsing_canonical_form
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.codec import (
    DISPATCH,
    HEARTBEAT,
    JOB_LOG,
    JOB_STATE,
    RUN_EVENTS,
    RUN_LOG,
    RUN_STATE,
    WORKER_INBOX,
    Codec,
    CodecError,
    HeartbeatWriter,
    JobLogCodec,
    JobStateCodec,
    KnownSpec,
    KnownSpecs,
    _union_body,
)
from schemas.convert import LEDGER_CLASSES, job_state_from_avro, job_state_to_avro
from schemas.json import dlq_record, from_json, read_dlq_record, to_json, to_plain
from schemas.records import (
    CancelOrder,
    ClaimReply,
    DeadlineKind,
    DispatchRequest,
    FireProposed,
    Heartbeat,
    JobEvent,
    JobState,
    JobUpserted,
    PendingBackfill,
    RecentRequest,
    RunEvent,
    RunLogChunk,
    RunningAttempt,
    RunReleased,
    RunState,
    RunStateName,
    Span,
    Trigger,
    UpstreamOutcome,
    WorkerAssignment,
    WorkerCapacity,
    WorkerMessage,
)
from schemas.registry import AVRO_DIR, HEADER_LENGTH, identify
from schemas.spec import (
    CONCURRENCY_POLICIES,
    DST_POLICIES,
    MISFIRE_POLICIES,
    NOTIFY_ON,
    AtSchedule,
    CronSchedule,
    EverySchedule,
    Exclusion,
    JobSpec,
    Notify,
    Param,
    Resources,
    RetryPolicy,
)

CODECS: dict[str, Codec[Any]] = {
    "job_log": JOB_LOG,
    "run_event": RUN_EVENTS,
    "job_state": JOB_STATE,
    "run_state": RUN_STATE,
    "dispatch": DISPATCH,
    "heartbeat": HEARTBEAT,
    "worker_inbox": WORKER_INBOX,
}
PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- strategies ---------------------------------------------------------------------------
ids = st.text(alphabet="abcxyz019-_.@:", min_size=1, max_size=10)
text = st.text(st.characters(codec="utf-8"), max_size=12)
ms = st.integers(0, 4_102_444_800_000)  # up to 2100
maybe_ms = st.none() | ms
attempts = st.integers(1, 20)
exit_codes = st.none() | st.integers(-255, 255)
reals = st.floats(0, 1e6, allow_nan=False, allow_infinity=False)
longs = st.integers(-(2**63), 2**63 - 1)
pairs = st.dictionaries(ids, text, max_size=3).map(lambda d: tuple(sorted(d.items())))
id_tuples = st.lists(ids, max_size=4).map(tuple)

schedules = st.one_of(
    st.none(),
    st.builds(CronSchedule, text, ids, st.none() | ms, st.none() | ms),
    st.builds(EverySchedule, st.integers(1, 10**12), st.none() | ms, st.none() | ms),
    st.builds(AtSchedule, ms),
)
resources = st.builds(Resources, reals, st.integers(0, 2**40), st.integers(0, 16), pairs)
specs = st.builds(
    JobSpec,
    job_id=ids,
    owner=ids,
    schedule=schedules,
    command=st.lists(text, max_size=4).map(tuple),
    env=pairs,
    secret_env=pairs,
    resources=resources,
    timeout_s=reals,
    retry=st.builds(RetryPolicy, st.integers(1, 10), reals, reals, reals),
    idempotent=st.booleans(),
    depends_on=id_tuples,
    misfire=st.sampled_from(MISFIRE_POLICIES),
    concurrency=st.sampled_from(CONCURRENCY_POLICIES),
    dst=st.sampled_from(DST_POLICIES),
    jitter_s=reals,
    priority=longs,
    notify=st.none() | st.builds(Notify, text, st.lists(st.sampled_from(NOTIFY_ON)).map(tuple)),
    sla_s=st.none() | reals,
    managed_by=st.just("") | ids,
    params=st.lists(
        st.builds(
            Param,
            ids,
            st.sampled_from(("string", "integer", "number", "boolean")),
            st.none() | text,
        ),
        max_size=3,
    ).map(tuple),
    params_in_command=st.booleans(),
    exclude=st.lists(st.builds(Exclusion, ids, text, text), max_size=2).map(tuple),
    max_runs=st.none() | st.integers(1, 10**6),
)

# Strategy per field name, shared by every record class (overridden where it differs).
BY_FIELD: dict[str, st.SearchStrategy[Any]] = {
    "spec": specs,
    "job_id": ids,
    "run_id": ids,
    "request_id": ids,
    "worker_id": ids,
    "placement": st.text(alphabet="0123456789abcdef", max_size=32),
    "event_id": ids,
    "proposer": ids,
    "owner": ids,
    "attempt": attempts,
    "exit_code": exit_codes,
    "error": text,
    "reason": text,
    "cancelling": text,
    "kind": st.sampled_from(get_args(DeadlineKind)),
    "trigger": st.sampled_from(get_args(Trigger)),
    "state": st.sampled_from(get_args(RunStateName)),
    "paused": st.booleans(),
    "deleted": st.booleans(),
    "live_runs": id_tuples,
    "final_runs": id_tuples,
    "trail": id_tuples,
    "cycle": id_tuples,
    "missed": st.sampled_from(("skip", "last", "all")),
    "schedule_runs": st.integers(0, 10**6),
    "probes": id_tuples,
    "recent_requests": st.lists(
        st.builds(RecentRequest, ids, st.integers(0, 2**45)), max_size=3
    ).map(tuple),
    "backfilled": st.lists(
        st.builds(Span, st.integers(0, 2**45), st.integers(0, 2**45)), max_size=3
    ).map(tuple),
    "backfill_queue": st.lists(
        st.builds(
            PendingBackfill,
            ids,
            st.integers(0, 2**45),
            st.integers(0, 2**45),
            st.integers(0, 2**45),
            st.integers(0, 10**5),
            st.dictionaries(ids, text, max_size=2).map(lambda d: tuple(sorted(d.items()))),
        ),
        max_size=2,
    ).map(tuple),
    "version": st.integers(0, 10**9),
    "seq": st.integers(0, 10**6),
    "next_due_ms": maybe_ms,
    "deadline_ms": maybe_ms,
    "deadline_kind": st.none() | st.sampled_from(get_args(DeadlineKind)),
    "started_ms": maybe_ms,
    "finished_ms": maybe_ms,
    "command": st.lists(text, max_size=4).map(tuple),
    "env": pairs,
    "params": st.dictionaries(ids, text, max_size=3).map(lambda d: tuple(sorted(d.items()))),
    "secret_env": pairs,
    "resources": resources,
    "timeout_s": reals,
    "priority": longs,
    "dependent": ids,
    "upstream": ids,
    "linked": st.booleans(),
    "succeeded": st.booleans(),
    "dependents": id_tuples,
    "upstream_outcomes": st.lists(
        st.builds(UpstreamOutcome, ids, st.integers(0, 2**45), st.booleans(), maybe_ms),
        max_size=3,
    ).map(tuple),
    "period_start_ms": maybe_ms,
    "upstream_next_ms": maybe_ms,
}


def records_of(cls: type[Any], **overrides: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    strategies = {}
    for f in fields(cls):
        if f.name in overrides:
            strategies[f.name] = overrides[f.name]
        elif f.name.endswith("_ms") and f.name not in BY_FIELD:
            strategies[f.name] = ms
        else:
            strategies[f.name] = BY_FIELD[f.name]
    return st.builds(cls, **strategies)


ledger_inputs = st.one_of(*(records_of(cls) for cls in LEDGER_CLASSES))
job_events = records_of(
    JobEvent,
    kind=st.sampled_from(("upserted", "paused", "resumed", "deleted")),
    spec=st.none() | specs,
)
run_events = records_of(RunEvent) | job_events
job_states = records_of(JobState)
run_states = records_of(RunState)
dispatches = records_of(DispatchRequest)

capacities = st.builds(WorkerCapacity, reals, st.integers(0, 2**40), st.integers(0, 16))
heartbeats = st.builds(
    Heartbeat,
    ids,
    ms,
    capacities,
    capacities,
    st.dictionaries(ids, text, max_size=3).map(lambda d: tuple(sorted(d.items()))),
    st.lists(st.builds(RunningAttempt, ids, attempts)).map(tuple),
)
run_log_chunks = st.builds(
    RunLogChunk,
    ids,
    attempts,
    st.sampled_from(["stdout", "stderr"]),
    st.integers(0, 2**40),
    text,
    st.booleans(),
    ids,
    ms,
)


def job_state(spec: JobSpec, **changes: Any) -> JobState:
    values: dict[str, Any] = {
        "spec": spec,
        "paused": False,
        "deleted": False,
        "created_ms": 1,
        "updated_ms": 2,
        "fired_ms": 3,
        "next_due_ms": None,
        "live_runs": (),
        "final_runs": (),
        "recent_requests": (RecentRequest("q", 2),),
        "version": 5,
    }
    return JobState(**{**values, **changes})


SPEC = JobSpec(
    "nightly",
    "team-a",
    CronSchedule("0 2 * * *", "Europe/Berlin"),
    ("etl", "--full"),
    env=(("MODE", "prod"),),
    resources=Resources(0.5, 256, 0, (("zone", "a"),)),
)
DISPATCH_SAMPLE = DispatchRequest(
    run_id="r@1",
    job_id="nightly",
    attempt=1,
    owner="team-a",
    command=("etl",),
    env=(("MODE", "prod"),),
    resources=Resources(0.5, 256),
    timeout_s=600.0,
    priority=0,
    scheduled_ms=1_000,
    not_before_ms=1_000,
    at_ms=900,
    placement="0123456789abcdef" * 2,
)
RUN_STATE_SAMPLE = RunState(
    run_id="r@1",
    job_id="nightly",
    scheduled_ms=1_000,
    trigger="schedule",
    state="running",
    attempt=1,
    worker_id="w1",
    created_ms=900,
    updated_ms=950,
    deadline_ms=2_000,
    deadline_kind="timeout",
    started_ms=960,
    finished_ms=None,
    exit_code=None,
    reason="",
    seq=3,
)
CAPACITY = WorkerCapacity(4.0, 8192, 0)
# One valid record of every topic.
FIXED: dict[str, Any] = {
    "job_log": FireProposed("nightly", 1_700_000_000_000, 1_700_000_000_500, "node-1"),
    "run_event": JobEvent("nightly#1", "nightly", "upserted", 5, SPEC),
    "job_state": job_state(SPEC, next_due_ms=4, live_runs=("r@1",), final_runs=("r@0",)),
    "run_state": RUN_STATE_SAMPLE,
    "dispatch": DISPATCH_SAMPLE,
    "heartbeat": Heartbeat(
        "w1", 5, CAPACITY, CAPACITY, (("zone", "a"),), (RunningAttempt("r@1", 1),)
    ),
    "worker_inbox": WorkerAssignment("w1", 5, DISPATCH_SAMPLE),
}


# -- round trips --------------------------------------------------------------------------
@PROPERTY
@given(ledger_inputs)
def test_job_log_round_trip(record: Any) -> None:
    assert JOB_LOG.decode(JOB_LOG.encode(record)) == record


@PROPERTY
@given(run_events)
def test_run_events_round_trip(record: RunEvent | JobEvent) -> None:
    assert RUN_EVENTS.decode(RUN_EVENTS.encode(record)) == record


@PROPERTY
@given(job_states)
def test_job_state_round_trip(record: JobState) -> None:
    assert JOB_STATE.decode(JOB_STATE.encode(record)) == record


@PROPERTY
@given(run_states)
def test_run_state_round_trip(record: RunState) -> None:
    assert RUN_STATE.decode(RUN_STATE.encode(record)) == record


@PROPERTY
@given(dispatches)
def test_dispatch_round_trip(record: DispatchRequest) -> None:
    assert DISPATCH.decode(DISPATCH.encode(record)) == record


@PROPERTY
@given(heartbeats)
def test_heartbeat_round_trip(record: Heartbeat) -> None:
    assert HEARTBEAT.decode(HEARTBEAT.encode(record)) == record


@given(heartbeats)
def test_a_heartbeat_read_without_its_list_is_the_rest_of_it(record: Heartbeat) -> None:
    data = HEARTBEAT.encode(record)
    assert HEARTBEAT.decode_without(data, "running") == replace(record, running=())
    with pytest.raises(CodecError):
        HEARTBEAT.decode_without(data + b"\x00", "running")  # trailing bytes


@PROPERTY
@given(st.lists(heartbeats, min_size=1, max_size=6), st.data())
def test_a_workers_beats_are_written_as_the_codec_writes_them(
    beats: list[Heartbeat], data: st.DataObject
) -> None:
    """One writer over a worker's beats, each holding some of the attempts of the beat
    before (kept bytes) and some new ones: every beat is the codec's encoding, byte for
    byte, so every reader of any version reads it."""
    writer = HeartbeatWriter()
    held: tuple[RunningAttempt, ...] = ()
    for beat in beats:
        kept = data.draw(st.lists(st.sampled_from(held), unique=True)) if held else []
        beat = replace(beat, running=(*kept, *beat.running))
        # As records, or (as a worker does) as (run id, attempt) pairs after the record's.
        split = data.draw(st.integers(0, len(beat.running)))
        pairs = [(a.run_id, a.attempt) for a in beat.running[split:]]
        written = writer.encode(replace(beat, running=beat.running[:split]), pairs)
        assert written == HEARTBEAT.encode(beat)
        held = beat.running


def test_a_heartbeat_list_is_written_as_an_avro_array_of_any_length() -> None:
    """Counts past one byte of varint (64 and more items), and back to none."""
    writer = HeartbeatWriter()
    for count in (1, 63, 64, 200, 9000, 0, 5):
        running = tuple(
            RunningAttempt(f"job-{i}@2026-12-07T01:00:00Z", i % 3) for i in range(count)
        )
        beat = Heartbeat("w1", 7, CAPACITY, CAPACITY, (), running)
        data = writer.encode(beat)
        assert (
            writer.encode(replace(beat, running=()), [(r.run_id, r.attempt) for r in running])
            == data
        )
        assert data == HEARTBEAT.encode(beat)
        assert HEARTBEAT.decode(data) == beat


def test_a_heartbeat_schema_whose_list_is_not_last_is_refused() -> None:
    """The writer splices the list at the end of the body: a schema that moved it would
    be written wrong, so it refuses to start."""
    current = HEARTBEAT.current
    moved = dict(
        current.schema, fields=[current.schema["fields"][-1], *current.schema["fields"][:-1]]
    )
    codec = Codec(
        dataclasses.replace(HEARTBEAT.schema, current=dataclasses.replace(current, schema=moved)),
        HEARTBEAT.to_avro,
        HEARTBEAT.from_avro,
    )
    with pytest.raises(ValueError, match="running"):
        HeartbeatWriter(codec)


@PROPERTY
@given(run_log_chunks)
def test_run_log_round_trip(record: RunLogChunk) -> None:
    assert RUN_LOG.decode(RUN_LOG.encode(record)) == record


worker_messages = (
    st.builds(WorkerAssignment, ids, ms, dispatches)
    | records_of(ClaimReply, granted=st.booleans())
    | records_of(CancelOrder)
)


@PROPERTY
@given(worker_messages)
def test_worker_inbox_round_trip(record: WorkerMessage) -> None:
    assert WORKER_INBOX.decode(WORKER_INBOX.encode(record)) == record


@pytest.mark.parametrize("cls", LEDGER_CLASSES, ids=lambda cls: cls.__name__)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_every_ledger_input_class_round_trips(cls: type[Any], data: st.DataObject) -> None:
    record = data.draw(records_of(cls))
    back = JOB_LOG.decode(JOB_LOG.encode(record))
    assert type(back) is cls
    assert back == record


def test_a_release_round_trips_on_the_job_log() -> None:
    record = RunReleased("nightly", "nightly@x", 2, "w1", "no room at its start time", 1_234)
    data = JOB_LOG.encode(record)
    assert JOB_LOG.version_of(data) is JOB_LOG.current
    back = JOB_LOG.decode(data)
    assert type(back) is RunReleased
    assert back == record
    assert from_json(to_json(record)) == record
    assert to_plain(record)["type"] == "RunReleased"


def _newest_without(name: str) -> Any:
    """The newest run_state version written before the field `name` was added."""
    for version in reversed(RUN_STATE.schema.versions):
        if name not in [f["name"] for f in version.schema["fields"]]:
            return version
    raise AssertionError(f"every run_state version has {name}")


def test_a_run_state_keeps_its_start_time_and_old_states_read_without_it() -> None:
    state = dataclasses.replace(RUN_STATE_SAMPLE, not_before_ms=1_500)
    assert RUN_STATE.decode(RUN_STATE.encode(state)) == state
    # A state written by the previous schema version (no not_before_ms) reads as None.
    previous = _newest_without("not_before_ms")
    buffer = io.BytesIO()
    buffer.write(previous.header)
    newer = ("not_before_ms", "cancelling", "params")
    old = {k: v for k, v in RUN_STATE.to_avro(RUN_STATE_SAMPLE).items() if k not in newer}
    schemaless_writer(buffer, previous.parsed, old)
    assert RUN_STATE.decode(buffer.getvalue()) == RUN_STATE_SAMPLE


def test_a_run_state_keeps_its_pending_cancel_and_older_states_have_none() -> None:
    state = dataclasses.replace(RUN_STATE_SAMPLE, cancelling="job paused before the run was due")
    assert RUN_STATE.decode(RUN_STATE.encode(state)) == state
    previous = _newest_without("cancelling")
    buffer = io.BytesIO()
    buffer.write(previous.header)
    old = {k: v for k, v in RUN_STATE.to_avro(state).items() if k not in ("cancelling", "params")}
    schemaless_writer(buffer, previous.parsed, old)
    assert RUN_STATE.decode(buffer.getvalue()) == dataclasses.replace(state, cancelling="")


@pytest.mark.parametrize(
    "schedule",
    [
        None,
        CronSchedule("0 2 * * *", "Europe/Berlin"),
        EverySchedule(30_000),
        AtSchedule(1_800_000_000_000),
    ],
    ids=repr,
)
def test_every_schedule_kind_round_trips(schedule: Any) -> None:
    spec = JobSpec("j", "o", schedule, ("true",), env=(("A", "1"),), depends_on=("x",))
    state = job_state(spec, live_runs=("r1",))
    assert JOB_STATE.decode(JOB_STATE.encode(state)) == state


def test_env_and_labels_come_back_sorted() -> None:
    spec = JobSpec(
        "j",
        "o",
        None,
        ("x",),
        env=(("b", "2"), ("a", "1")),
        resources=Resources(labels=(("z", "1"), ("m", "2"))),
    )
    state = job_state(spec)
    back = JOB_STATE.decode(JOB_STATE.encode(state)).spec
    assert back.env == (("a", "1"), ("b", "2"))
    assert back.resources.labels == (("m", "2"), ("z", "1"))


# -- the single-object header -------------------------------------------------------------
def test_rabin_fingerprint_byte_order_matches_the_avro_spec() -> None:
    # The spec's CRC-64-AVRO of "int" is 0x7275d51a3f395c8f, written little-endian.
    assert bytes.fromhex(fingerprint('"int"', "CRC-64-AVRO")) == (0x7275D51A3F395C8F).to_bytes(
        8, "little"
    )


@pytest.mark.parametrize("name", sorted(CODECS))
def test_header_is_marker_and_fingerprint_of_the_canonical_form(name: str) -> None:
    codec = CODECS[name]
    data = codec.encode(FIXED[name])
    # Independently of the registry: the shipped file of this version, through fastavro.
    raw = orjson.loads(
        (AVRO_DIR / "history" / f"{name}.v{codec.current.version}.avsc").read_bytes()
    )
    canonical = to_parsing_canonical_form(parse_schema(raw))
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
    assert data[:10] == codec.header
    # A reader with nothing but the schema file decodes the body.
    body = schemaless_reader(io.BytesIO(data[10:]), parse_schema(raw), None)
    assert body == schemaless_reader(io.BytesIO(data[10:]), codec.current.parsed, None)
    found = identify(data)
    assert found is not None
    assert (found.name, found.version) == (name, codec.current.version)
    assert codec.version_of(data) is codec.current


def test_fingerprints_are_distinct_across_schemas() -> None:
    headers = [c.header for c in CODECS.values()]
    assert len(set(headers)) == len(headers)


# -- bad bytes ----------------------------------------------------------------------------
def fire() -> bytes:
    return JOB_LOG.encode(FIXED["job_log"])


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "shorter than"),
        (b"\xc3\x01\x00", "shorter than"),
        (b'{"type": "job.upsert"}', "not Avro single-object"),
        (b"\xc3\x02" + bytes(8) + b"\x00", "marker"),
        (b"\xc3\x01" + bytes(8) + b"\x00", "unknown schema fingerprint"),
    ],
)
def test_bad_headers_raise_codec_error(data: bytes, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        JOB_LOG.decode(data)
    assert identify(data) is None


def test_truncated_bodies_raise_codec_error() -> None:
    data = fire()
    for cut in range(10, len(data)):
        with pytest.raises(CodecError):
            JOB_LOG.decode(data[:cut])


def test_trailing_bytes_raise_codec_error() -> None:
    with pytest.raises(CodecError, match="trailing"):
        JOB_LOG.decode(fire() + b"\x00")


def test_a_record_of_another_topic_is_refused() -> None:
    data = fire()
    with pytest.raises(CodecError, match="unknown schema fingerprint"):
        RUN_STATE.decode(data)


def test_bad_union_index_raises_codec_error() -> None:
    data = fire()
    with pytest.raises(CodecError, match="undecodable"):
        JOB_LOG.decode(data[:10] + b"\x7f" + data[11:])  # branch 63 of 14


def test_codec_error_is_a_value_error() -> None:
    assert issubclass(CodecError, ValueError)


@PROPERTY
@given(st.sampled_from(sorted(CODECS)), st.binary(max_size=64))
def test_garbage_after_a_valid_header_decodes_or_raises_codec_error(
    name: str, garbage: bytes
) -> None:
    codec = CODECS[name]
    with contextlib.suppress(CodecError):
        codec.decode(codec.header + garbage)


def test_encoding_a_wrong_record_raises_codec_error() -> None:
    with pytest.raises(CodecError, match="cannot encode"):
        JOB_LOG.encode(RUN_STATE_SAMPLE)  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="cannot encode"):
        HEARTBEAT.encode({"worker_id": "w"})  # type: ignore[arg-type]
    bad_state = dataclasses.replace(RUN_STATE_SAMPLE, state="nonsense")  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="cannot encode"):
        RUN_STATE.encode(bad_state)


# -- JSON ---------------------------------------------------------------------------------
@PROPERTY
@given(ledger_inputs | run_events | job_states | run_states | dispatches | specs)
def test_json_round_trip(record: Any) -> None:
    data = to_json(record)
    assert from_json(data) == record
    assert from_json(data, type(record)) == record


def test_json_shape_is_for_humans() -> None:
    spec = JobSpec(
        "nightly",
        "team-a",
        CronSchedule("0 2 * * *", "Europe/Berlin"),
        ("etl",),
        env=(("MODE", "prod"),),
        resources=Resources(0.5, 256, 0, (("zone", "a"),)),
    )
    plain = to_plain(job_state(spec))
    assert plain["type"] == "JobState"
    assert plain["spec"]["schedule"] == {"cron": "0 2 * * *", "timezone": "Europe/Berlin"}
    assert plain["spec"]["env"] == {"MODE": "prod"}
    assert plain["spec"]["resources"]["labels"] == {"zone": "a"}
    every = orjson.loads(to_json(JobSpec("j", "o", EverySchedule(5), ())))
    assert every["type"] == "JobSpec"
    assert every["schedule"] == {"every_ms": 5}
    assert orjson.loads(to_json(JobSpec("j", "o", AtSchedule(7), ())))["schedule"] == {"at_ms": 7}


def test_from_json_refuses_the_wrong_type() -> None:
    with pytest.raises(ValueError, match="expected a RunState"):
        from_json(to_json(FireProposed("j", 1, 2)), RunState)
    with pytest.raises(ValueError, match="record type"):
        from_json(b'{"type": "Nope"}')
    with pytest.raises(ValueError, match="not a FireProposed"):
        from_json(b'{"type": "FireProposed", "job_id": "j"}')


def test_dlq_record_keeps_the_original_bytes_and_where_they_came_from() -> None:
    original = b"\xc3\x01\xff not json, not avro \x00"
    data = dlq_record(original, "unknown schema fingerprint", "cronlog.job-log", 3, 42)
    obj = orjson.loads(data)
    assert obj["reason"] == "unknown schema fingerprint"
    assert (obj["topic"], obj["partition"], obj["offset"]) == ("cronlog.job-log", 3, 42)
    letter = read_dlq_record(data)
    assert letter.original == original
    assert (letter.reason, letter.topic, letter.partition, letter.offset) == (
        "unknown schema fingerprint",
        "cronlog.job-log",
        3,
        42,
    )


@PROPERTY
@given(job_states, st.booleans())
def test_the_spliced_job_state_is_byte_for_byte_the_plain_encoding(
    record: JobState, again: bool
) -> None:
    # JobStateCodec writes the spec's cached bytes and the other fields apart: the result
    # must be what the generic codec writes, on the first write of a spec and the next.
    plain = Codec(JOB_STATE.schema, job_state_to_avro, job_state_from_avro)
    spliced = JOB_STATE.encode(record)
    if again:
        spliced = JOB_STATE.encode(dataclasses.replace(record, version=record.version + 1))
        record = dataclasses.replace(record, version=record.version + 1)
    assert spliced == plain.encode(record)
    assert JOB_STATE.decode(spliced) == record


@PROPERTY
@given(job_states, job_states, st.booleans())
def test_a_state_decoded_knowing_an_earlier_spec_is_the_state(
    first: JobState, second: JobState, same_spec: bool
) -> None:
    # The projector decodes a job's states passing the spec of the previous one: a state
    # of the same spec skips reading it, one of another spec reads it, and both come out
    # as the plain decoding says, with the spec's bytes to pass on.
    if same_spec:
        second = dataclasses.replace(second, spec=first.spec)
    data1, data2 = JOB_STATE.encode(first), JOB_STATE.encode(second)
    state1, known1 = JOB_STATE.decode_knowing(data1, None)
    assert state1 == first
    assert known1 is not None
    assert data1.startswith(known1.data, HEADER_LENGTH)
    assert known1.data == JOB_STATE.spec_bytes(first.spec)
    state2, known2 = JOB_STATE.decode_knowing(data2, known1)
    assert state2 == second == JOB_STATE.decode(data2)
    assert known2 is not None
    assert (known2 is known1) == (same_spec or known1.data == JOB_STATE.spec_bytes(second.spec))
    assert known2.data == JOB_STATE.spec_bytes(second.spec)


def test_the_known_specs_are_bounded_by_their_bytes_and_drop_the_least_recently_used() -> None:
    def known(size: int) -> KnownSpec:
        return KnownSpec(b"x" * size, SPEC)

    specs = KnownSpecs(max_bytes=100)
    for key in (b"a", b"b", b"c"):
        specs.put(key, known(30))
    assert (len(specs), specs.bytes) == (3, 90)
    assert specs.get(b"a") is not None  # a read does not refresh: the next put does
    specs.put(b"a", known(30))  # a's state written again: the most recent now
    specs.put(b"d", known(30))  # 120 bytes: b, the least recently used, goes
    assert [specs.get(k) is not None for k in (b"a", b"b", b"c", b"d")] == [
        True,
        False,
        True,
        True,
    ]
    assert specs.bytes == 90
    specs.put(b"e", known(101))  # larger than the whole bound: not kept
    assert specs.get(b"e") is None
    assert specs.bytes == 90
    specs.put(b"c", None)  # a state of an older version: forgotten
    assert (len(specs), specs.bytes) == (2, 60)


def test_a_state_decoded_knowing_a_spec_rejects_what_the_plain_decoding_rejects() -> None:
    state = job_state(SPEC)
    data = JOB_STATE.encode(state)
    _, known = JOB_STATE.decode_knowing(data, None)
    for bad in (data + b"\x00", data[:-1]):
        with pytest.raises(CodecError):
            JOB_STATE.decode(bad)
        with pytest.raises(CodecError):
            JOB_STATE.decode_knowing(bad, known)
        with pytest.raises(CodecError):
            JOB_STATE.decode_knowing(bad, None)


@PROPERTY
@given(job_events, st.booleans())
def test_the_spliced_job_event_is_byte_for_byte_the_plain_encoding(
    record: JobEvent, cached: bool
) -> None:
    # RUN_EVENTS splices a job event's spec from the job state codec's bytes: the result
    # must be what the generic codec writes, whether the spec's bytes were cached or not.
    plain = Codec(RUN_EVENTS.schema, *_union_body((RunEvent, JobEvent)))
    if cached and record.spec is not None:
        JOB_STATE.spec_bytes(record.spec)
    spliced = RUN_EVENTS.encode(record)
    assert spliced == plain.encode(record)
    assert RUN_EVENTS.decode(spliced) == record


@PROPERTY
@given(specs, st.integers(-(2**63), 2**63 - 1))
def test_a_registrations_spec_bytes_read_from_job_log_are_its_encoding(
    spec: JobSpec, at_ms: int
) -> None:
    # The ledger decodes a JobUpserted keeping its spec's bytes (a slice of the record):
    # the job state and the job event written with them must be what the plain codecs
    # write, whatever the spec and however long at_ms's varint.
    codec = JobStateCodec(JOB_STATE.schema)
    job_log = JobLogCodec(JOB_LOG.schema, codec)
    upsert = job_log.decode_keeping_spec(JOB_LOG.encode(JobUpserted(spec, at_ms)))
    assert isinstance(upsert, JobUpserted)
    assert upsert == JobUpserted(spec, at_ms)
    kept = codec.spec_bytes(upsert.spec)  # a hit: nothing encoded
    assert kept == JobStateCodec(JOB_STATE.schema).spec_bytes(upsert.spec)
    plain = Codec(JOB_STATE.schema, job_state_to_avro, job_state_from_avro)
    state = job_state(upsert.spec)
    assert codec.encode(state) == plain.encode(state)


def test_only_a_current_registration_hands_over_its_spec_bytes() -> None:
    codec = JobStateCodec(JOB_STATE.schema)
    job_log = JobLogCodec(JOB_LOG.schema, codec)
    spec = JobSpec(job_id="j", owner="o", schedule=EverySchedule(60_000), command=("true",))
    job_log.decode_keeping_spec(JOB_LOG.encode(FireProposed("j", 60_000, 1, "n")))
    assert codec.cached_specs() == []
    upsert = job_log.decode_keeping_spec(JOB_LOG.encode(JobUpserted(spec, 5)))
    assert isinstance(upsert, JobUpserted)
    assert [id(spec) for spec in codec.cached_specs()] == [id(upsert.spec)]


@given(specs)
def test_the_spec_cache_is_bounded_and_never_confuses_two_specs(spec: JobSpec) -> None:
    codec = JobStateCodec(JOB_STATE.schema)
    codec.SPEC_CACHE = 3
    states = [job_state(dataclasses.replace(spec, job_id=f"job-{i}")) for i in range(5)]
    for state in states:
        assert codec.decode(codec.encode(state)) == state
    assert len(codec.cached_specs()) == 3
    assert codec.decode(codec.encode(states[0])).spec.job_id == "job-0"
