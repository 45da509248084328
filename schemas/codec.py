"""Per-topic codecs: frozen dataclasses <-> Avro single-object encoding.

Wire format of every value (Avro spec, "Single object encoding"): b"\\xc3\\x01", the
8-byte little-endian CRC-64-AVRO fingerprint of the writer schema's Parsing Canonical
Form, then the Avro binary body. A codec writes with its topic's current schema and reads
any version of it in `schemas/avro/history/` (by Avro schema resolution into the current
one), so a reader with the schema files can decode any topic and tell which schema
version wrote a record (`Codec.version_of`, `schemas.registry.identify`).

    JOB_LOG.encode(FireProposed(...)) -> bytes;  JOB_LOG.decode(data) -> LedgerInput
    RUN_EVENTS (RunEvent | JobEvent), JOB_STATE, RUN_STATE, DISPATCH: the same
    HEARTBEAT: Heartbeat records (heartbeat.avsc)
    WORKER_INBOX: WorkerAssignment | ClaimReply | CancelOrder
    RUN_LOG: RunLogChunk records (run_log.avsc)
    codec.to_avro / codec.from_avro: the record <-> dict conversions alone

Undecodable bytes raise CodecError (a ValueError): send the record to a dead letter place.
"""

from __future__ import annotations

import contextlib
import io
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import to_parsing_canonical_form

from schemas.convert import (
    CONVERTERS,
    LEDGER_CLASSES,
    WORKER_CLASSES,
    AvroDict,
    dispatch_from_avro,
    dispatch_to_avro,
    heartbeat_from_avro,
    heartbeat_to_avro,
    job_state_from_avro,
    job_state_from_rest,
    job_state_rest_to_avro,
    job_state_to_avro,
    run_log_from_avro,
    run_log_to_avro,
    run_state_from_avro,
    run_state_to_avro,
    spec_from_avro,
    spec_to_avro,
)
from schemas.records import (
    DispatchRequest,
    Heartbeat,
    JobEvent,
    JobState,
    JobUpserted,
    LedgerInput,
    RunEvent,
    RunLogChunk,
    RunningAttempt,
    RunState,
    WorkerMessage,
)
from schemas.registry import HEADER_LENGTH, MARKER, SchemaVersion, TopicSchema, shipped
from schemas.spec import JobSpec

T = TypeVar("T")


class CodecError(ValueError):
    """Bytes that are not a record of this topic (or a record that cannot be written)."""


# What fastavro raises for a record that does not fit the writer schema.
ENCODE_ERRORS = (KeyError, TypeError, ValueError, AttributeError, OverflowError)


class Codec(Generic[T]):
    """Encodes and decodes the values of one topic. Thread-safe; build once and reuse."""

    def __init__(
        self,
        schema: TopicSchema,
        to_avro: Callable[[T], Any],
        from_avro: Callable[[Any], T],
        *,
        record_names: bool = True,
    ) -> None:
        self.schema = schema
        self.topic = schema.topic
        self.current: SchemaVersion = schema.current
        self.header: bytes = schema.current.header
        self.to_avro = to_avro
        self.from_avro = from_avro
        self._record_names = record_names
        self._writer = schema.current.parsed
        # fingerprint -> (writer version, (writer schema, reader schema or None)).
        self._readers: dict[bytes, tuple[SchemaVersion, tuple[Any, Any]]] = {
            fp: (v, (v.parsed, None if v is self.current else self.current.parsed))
            for fp, v in schema.by_fingerprint().items()
        }
        # The current schema always reads itself without resolution.
        self._readers[self.current.fingerprint] = (self.current, (self._writer, None))
        self._without: dict[str, Any] = {}  # field -> the current schema without it, parsed

    def __repr__(self) -> str:
        return f"Codec({self.schema.name!r}, v{self.current.version}, topic {self.topic!r})"

    def encode(self, record: T) -> bytes:
        buffer = io.BytesIO()
        buffer.write(self.header)
        try:
            schemaless_writer(buffer, self._writer, self.to_avro(record))
        except ENCODE_ERRORS as err:
            raise self.unwritable(record, err) from err
        return buffer.getvalue()

    def unwritable(self, record: Any, err: Exception) -> CodecError:
        return CodecError(
            f"cannot encode {type(record).__name__} as {self.schema.name} "
            f"v{self.current.version}: {type(err).__name__}: {err}"
        )

    def version_of(self, data: bytes) -> SchemaVersion:
        """The schema version that wrote `data`; CodecError if not one of this topic's."""
        if len(data) < HEADER_LENGTH:
            raise CodecError(
                f"{self.topic}: {len(data)} bytes, shorter than the {HEADER_LENGTH}-byte "
                "single-object header"
            )
        if data[:2] != MARKER:
            raise CodecError(
                f"{self.topic}: not Avro single-object encoding "
                f"(marker {bytes(data[:2]).hex()}, expected {MARKER.hex()})"
            )
        fp = bytes(data[2:HEADER_LENGTH])
        found = self._readers.get(fp)
        if found is None:
            raise CodecError(
                f"{self.topic}: unknown schema fingerprint {fp.hex()} "
                f"(known: {', '.join(sorted(k.hex() for k in self._readers))})"
            )
        return found[0]

    def decode_avro(self, data: bytes) -> Any:
        """The record as fastavro reads it (dicts), in the current schema's shape."""
        version = self.version_of(data)
        writer, reader = self._readers[version.fingerprint][1]
        return self._read_body(data, version, writer, reader)

    def _read_body(self, data: bytes, version: SchemaVersion, writer: Any, reader: Any) -> Any:
        """The body of `data` (written in `version`) read with `reader` (None: as written)."""
        buffer = io.BytesIO(data)
        buffer.seek(HEADER_LENGTH)
        try:
            datum = schemaless_reader(
                buffer,
                writer,
                reader,
                return_record_name=self._record_names,
                return_record_name_override=self._record_names,
            )
        except Exception as err:
            raise self._undecodable(version, err) from err
        self._check_end(buffer, data, version)
        return datum

    def _undecodable(self, version: SchemaVersion, err: Exception) -> CodecError:
        return CodecError(
            f"{self.topic}: undecodable body for {self.schema.name} v{version.version}: "
            f"{type(err).__name__}: {err}"
        )

    def _check_end(self, buffer: io.BytesIO, data: bytes, version: SchemaVersion) -> None:
        """The record must end where `data` does."""
        if buffer.tell() != len(data):
            raise CodecError(
                f"{self.topic}: {len(data) - buffer.tell()} trailing bytes after the record "
                f"({self.schema.name} v{version.version})"
            )

    def decode_without(self, data: bytes, field: str) -> T:
        """The record with its top-level `field` skipped, not built (it reads as the
        field's absence: its default in the record class). For a reader that needs a
        large field only now and then: skipping an array still walks it, but about five
        times faster than building its items."""
        version = self.version_of(data)
        writer = self._readers[version.fingerprint][1][0]
        reader = self._without.get(field)
        if reader is None:
            schema = dict(self.current.schema)
            schema["fields"] = [f for f in schema["fields"] if f["name"] != field]
            reader = self._without[field] = parse_schema(schema)
        return self._converted(self._read_body(data, version, writer, reader))

    def decode(self, data: bytes) -> T:
        return self._converted(self.decode_avro(data))

    def _converted(self, datum: Any) -> T:
        try:
            return self.from_avro(datum)
        except (KeyError, TypeError, ValueError) as err:
            raise CodecError(
                f"{self.topic}: record does not fit {self.schema.name}: {type(err).__name__}: {err}"
            ) from err


@dataclass(frozen=True, slots=True)
class KnownSpec:
    """A spec and its bytes as a job state holds them (`JobStateCodec.decode_knowing`)."""

    data: bytes
    spec: JobSpec


class KnownSpecs:
    """The latest spec of each job, by the key of its state records, for
    `JobStateCodec.decode_knowing`; the least recently used go first beyond `max_bytes`
    of spec bytes (a spec may be tens of KB: a count would not bound the memory)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        # An OrderedDict: dropping a plain dict's first entry over and over scans the
        # holes the drops leave at its front (see `JobStateCodec._specs`).
        self._known: OrderedDict[bytes, KnownSpec] = OrderedDict()

    def __len__(self) -> int:
        return len(self._known)

    def get(self, key: bytes) -> KnownSpec | None:
        return self._known.get(key)

    def put(self, key: bytes, known: KnownSpec | None) -> None:
        """Keep `known` as `key`'s (None: forget it), the most recently used."""
        old = self._known.pop(key, None)
        if old is not None:
            self.bytes -= len(old.data)
        if known is None or len(known.data) > self.max_bytes:
            return
        self._known[key] = known
        self.bytes += len(known.data)
        while self.bytes > self.max_bytes:
            _, gone = self._known.popitem(last=False)
            self.bytes -= len(gone.data)


class JobStateCodec(Codec[JobState]):
    """JOB_STATE, with each spec encoded once rather than on every write of the state.

    The ledger writes a job's state on every decision about it (a firing, a claim, a
    finish) while the spec changes only with an upsert, and the spec is most of the
    bytes and of the encoding time. Avro's binary form of a record is the concatenation
    of its fields' forms, in the schema's order, so a state is the header, the spec's
    bytes (`spec` is the schema's first field) and the bytes of the other fields written
    as a record of their own: byte for byte what the plain codec writes (a unit test
    checks it). The spec's bytes are kept per spec object (a state replaced by a decision
    keeps its spec object), for the last `SPEC_CACHE` specs written.
    """

    SPEC_CACHE = 65_536

    def __init__(self, schema: TopicSchema) -> None:
        super().__init__(schema, job_state_to_avro, job_state_from_avro)
        full = self.current.schema
        first, *rest = full["fields"]
        if first["name"] != "spec":
            raise ValueError(f"{schema.name}: the spec must be the first field to be spliced")
        self._spec_writer = parse_schema(first["type"])
        self._rest_writer = parse_schema({**full, "name": f"{full['name']}Rest", "fields": rest})
        # id(spec) -> (spec, its bytes); the spec held so that its id is never reused
        # while the entry lives, and a hit checked by identity. An OrderedDict: dropping
        # a plain dict's first entry over and over scans the holes the drops leave at its
        # front, which cost a fifth of the ledger's time registering 400,000 jobs.
        self._specs: OrderedDict[int, tuple[JobSpec, bytes]] = OrderedDict()

    def spec_bytes(self, spec: JobSpec) -> bytes:
        hit = self._specs.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        buffer = io.BytesIO()
        schemaless_writer(buffer, self._spec_writer, spec_to_avro(spec))
        data = buffer.getvalue()
        self.remember(spec, data)
        return data

    def writes_spec_as(self, schema: Any) -> bool:
        """Whether `schema` (a JobSpec as another topic's schema has it) is written byte
        for byte as this codec writes a spec: the same canonical form."""
        return bool(
            to_parsing_canonical_form(parse_schema(schema))
            == to_parsing_canonical_form(self._spec_writer)
        )

    def cached_specs(self) -> list[JobSpec]:
        """The specs whose bytes are kept, oldest first (the unit tests of the cache's
        bound and of which registrations hand their bytes over read it)."""
        return [spec for spec, _ in list(self._specs.values())]

    def remember(self, spec: JobSpec, data: bytes) -> None:
        """Keep `data` as the bytes of `spec` (its encoding, or read from a record that
        holds it encoded the same way: `JobLogCodec.decode_keeping_spec`)."""
        if len(self._specs) >= self.SPEC_CACHE:
            # The oldest entry; another thread may have emptied it meanwhile.
            with contextlib.suppress(KeyError):
                self._specs.popitem(last=False)
        self._specs[id(spec)] = (spec, data)

    def decode_knowing(
        self, data: bytes, known: KnownSpec | None
    ) -> tuple[JobState, KnownSpec | None]:
        """Decode a state without reading its spec again when it begins with `known`'s
        bytes (those of an earlier state of the job: a spec changes only with an upsert,
        and its decoding is most of a state's). A spec's binary form is self-delimiting,
        so a state that begins with the whole of `known.data` holds that very spec.
        Returns the state and its own spec's bytes and spec, to pass with the next (None
        for a state an older schema version wrote, whose bytes differ)."""
        version = self.version_of(data)
        if version is not self.current:  # an older writer: resolved as a whole
            return self.decode(data), None
        buffer = io.BytesIO(data)
        try:
            if known is not None and data.startswith(known.data, HEADER_LENGTH):
                buffer.seek(HEADER_LENGTH + len(known.data))
                spec = known.spec
            else:
                buffer.seek(HEADER_LENGTH)
                spec = spec_from_avro(self._read(buffer, self._spec_writer))
                known = KnownSpec(data[HEADER_LENGTH : buffer.tell()], spec)
            rest = self._read(buffer, self._rest_writer)
            state = job_state_from_rest(spec, rest)
        except Exception as err:
            raise self._undecodable(version, err) from err
        self._check_end(buffer, data, version)
        return state, known

    @staticmethod
    def _read(buffer: io.BytesIO, schema: Any) -> AvroDict:
        """A record as `Codec.decode_avro` reads one (union branches by name)."""
        datum = schemaless_reader(
            buffer, schema, None, return_record_name=True, return_record_name_override=True
        )
        assert isinstance(datum, dict)  # the schemas read here are records
        return datum

    def encode(self, record: JobState) -> bytes:
        buffer = io.BytesIO()
        buffer.write(self.header)
        try:
            buffer.write(self.spec_bytes(record.spec))
            schemaless_writer(buffer, self._rest_writer, job_state_rest_to_avro(record))
        except ENCODE_ERRORS as err:
            raise self.unwritable(record, err) from err
        return buffer.getvalue()


class RunEventsCodec(Codec[RunEvent | JobEvent]):
    """RUN_EVENTS, with a job event's spec spliced in from the job state codec's bytes.

    A registration or change writes its spec twice: in the job state and in the job
    event on run-events, and encoding it twice would be a large share of the ledger's
    work per upsert.
    A job event's spec is its last field, a union ["null", JobSpec]: its binary form is
    the event written with no spec (ending in the null branch's index, 0x00) with that
    last byte replaced by the JobSpec branch's index (0x02) followed by the spec's bytes,
    which the job state codec keeps per spec object. Byte for byte what the plain codec
    writes (a unit test checks it).
    """

    def __init__(self, schema: TopicSchema, specs: JobStateCodec) -> None:
        super().__init__(schema, *_union_body((RunEvent, JobEvent)))
        self._specs = specs

    def encode(self, record: RunEvent | JobEvent) -> bytes:
        if not isinstance(record, JobEvent) or record.spec is None:
            return super().encode(record)
        head = super().encode(replace(record, spec=None))
        try:
            spec = self._specs.spec_bytes(record.spec)
        except ENCODE_ERRORS as err:
            raise self.unwritable(record, err) from err
        return head[:-1] + b"\x02" + spec


class JobLogCodec(Codec[LedgerInput]):
    """JOB_LOG, able to hand a registration's spec bytes to the job state codec.

    A `JobUpserted` in the current version is the header, its union branch's index (one
    byte), the spec and `at_ms` (a zig-zag varint): its spec's bytes are a slice of the
    record. The ledger decodes its inputs with `decode_keeping_spec`, so the job state
    and the job event it writes for the upsert splice those bytes instead of encoding
    the spec again (a fifth of its work per registration). Only where job-log's JobSpec
    is written as the job state's is (checked at start; a unit test checks the bytes).
    """

    def __init__(self, schema: TopicSchema, specs: JobStateCodec) -> None:
        super().__init__(schema, *_union_body(LEDGER_CLASSES))
        self._specs = specs
        branches = self.current.schema["fields"][0]["type"]
        names = [branch["name"] for branch in branches]
        index = names.index("JobUpserted")
        fields = branches[index]["fields"]
        self._upsert: bytes | None = None
        if (
            index < 64  # its zig-zag index is one byte
            and [f["name"] for f in fields] == ["spec", "at_ms"]
            and specs.writes_spec_as(fields[0]["type"])
        ):
            self._upsert = self.current.fingerprint + bytes([index * 2])

    def decode_keeping_spec(self, data: bytes) -> LedgerInput:
        record = self.decode(data)
        if (
            self._upsert is not None
            and isinstance(record, JobUpserted)
            and data[2 : HEADER_LENGTH + 1] == self._upsert
        ):
            end = len(data) - _varint_length(record.at_ms)
            self._specs.remember(record.spec, bytes(data[HEADER_LENGTH + 1 : end]))
        return record


def _varint_length(n: int) -> int:
    """Bytes of Avro's zig-zag varint of the long `n`."""
    zigzag = (n << 1) ^ (n >> 63)
    length = 1
    while zigzag >= 0x80:
        zigzag >>= 7
        length += 1
    return length


def _union_body(
    classes: Iterable[type[Any]],
) -> tuple[Callable[[Any], AvroDict], Callable[[AvroDict], Any]]:
    """Converters for a record {"body": union of one record type per class}."""
    to_avro = {cls: CONVERTERS[cls][:2] for cls in classes}
    from_avro = {CONVERTERS[cls][0]: CONVERTERS[cls][2] for cls in classes}

    def to_body(record: Any) -> AvroDict:
        try:
            name, convert = to_avro[type(record)]
        except KeyError:
            raise TypeError(f"not one of {[c.__name__ for c in to_avro]}") from None
        return {"body": (name, convert(record))}

    def from_body(datum: AvroDict) -> Any:
        name, body = datum["body"]
        return from_avro[name](body)

    return to_body, from_body


_SCHEMAS = shipped()

JOB_STATE: JobStateCodec = JobStateCodec(_SCHEMAS["job_state"])
JOB_LOG: JobLogCodec = JobLogCodec(_SCHEMAS["job_log"], JOB_STATE)
RUN_EVENTS: Codec[RunEvent | JobEvent] = RunEventsCodec(_SCHEMAS["run_event"], JOB_STATE)
RUN_STATE: Codec[RunState] = Codec(_SCHEMAS["run_state"], run_state_to_avro, run_state_from_avro)
DISPATCH: Codec[DispatchRequest] = Codec(_SCHEMAS["dispatch"], dispatch_to_avro, dispatch_from_avro)
HEARTBEAT: Codec[Heartbeat] = Codec(
    _SCHEMAS["heartbeat"], heartbeat_to_avro, heartbeat_from_avro, record_names=False
)
WORKER_INBOX: Codec[WorkerMessage] = Codec(_SCHEMAS["worker_inbox"], *_union_body(WORKER_CLASSES))


def _avro_long(n: int) -> bytes:
    """An Avro long (zigzag, then base-128 varint), as an array block's count is written."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class HeartbeatWriter:
    """One worker's beats, byte for byte as `HEARTBEAT.encode` writes them, with each held
    attempt's bytes kept from the beats before. A beat lists every attempt the worker
    holds, once a second, and in a burst that is tens of thousands, of which a few are
    new each beat: building and encoding them all took half of a worker's samples in a
    burst of 100,000 (docs/performance.md). Not thread-safe: one per beating thread.

    The body of a record is its fields' encodings in order, and `running` is the last
    field: an empty array (one 0 byte) is replaced by the count, the items and the 0
    that ends an array."""

    def __init__(self, codec: Codec[Heartbeat] = HEARTBEAT) -> None:
        last = codec.current.schema["fields"][-1]
        if last["name"] != "running" or last["type"]["type"] != "array":
            raise ValueError(f"{codec}: `running` is not the last field: cannot splice it")
        self.codec = codec
        self._item = parse_schema(last["type"]["items"])
        self._known: dict[tuple[str, int], bytes] = {}  # (run id, attempt) -> its item

    def encode(self, record: Heartbeat, held: Sequence[tuple[str, int]] = ()) -> bytes:
        """`record` with the attempts `held`, (run id, attempt) pairs, listed after its
        own `running` (a caller holding pairs need not build a record of each)."""
        head = self.codec.encode(replace(record, running=()))
        keys = [(a.run_id, a.attempt) for a in record.running]
        keys += held
        known = self._known
        if len(known) > 2 * len(keys) + 1024:  # mostly attempts no longer held
            self._known = known = {k: known[k] for k in keys if k in known}
        parts = [known.get(key) or self._encoded(key) for key in keys]
        if not parts:
            return head
        return b"".join((head[:-1], _avro_long(len(parts)), *parts, b"\x00"))

    def _encoded(self, key: tuple[str, int]) -> bytes:
        buffer = io.BytesIO()
        try:
            schemaless_writer(buffer, self._item, {"run_id": key[0], "attempt": key[1]})
        except ENCODE_ERRORS as err:
            raise self.codec.unwritable(RunningAttempt(*key), err) from err
        data = self._known[key] = buffer.getvalue()
        return data


# topic (without prefix) -> its codec
RUN_LOG: Codec[RunLogChunk] = Codec(
    _SCHEMAS["run_log"], run_log_to_avro, run_log_from_avro, record_names=False
)

BY_TOPIC: dict[str, Codec[Any]] = {
    c.topic: c
    for c in (JOB_LOG, RUN_EVENTS, JOB_STATE, RUN_STATE, DISPATCH, HEARTBEAT, WORKER_INBOX, RUN_LOG)
}
