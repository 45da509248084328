"""How every cronlog process logs: plain text, or one JSON object per line.

`--log-format json` (or `CRONLOG_LOG_FORMAT=json`) makes each record one line of JSON,
for a log shipper to index without parsing: `ts` (UTC, ISO 8601 with milliseconds),
`level`, `logger`, `component` (scheduler, ledger, worker, projector, api), `instance`
(the node or worker id), `message`, and `run_id` / `job_id` when the call site gave them
(`extra={"run_id": ...}`), with `exc` holding a traceback if there is one. In that
format librdkafka's own log lines (otherwise written to stderr by the library, `%3|...`)
are routed through the same handler by the clients cronlog builds (`kafka_log_settings`),
so they come out as JSON lines too.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from typing import Any, Final, Literal

import orjson

LogFormat = Literal["text", "json"]
FORMATS: Final[tuple[LogFormat, ...]] = ("text", "json")
TEXT_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Fields taken from a record's `extra` when present.
_FIELDS: Final = ("run_id", "job_id", "attempt", "worker_id", "partition")


class LogFormatError(ValueError):
    """An unknown log format: a usage error."""


class JsonFormatter(logging.Formatter):
    def __init__(self, component: str, instance: str | None):
        super().__init__()
        self.component = component
        self.instance = instance

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "component": self.component,
            "message": record.getMessage(),
        }
        if self.instance:
            line["instance"] = self.instance
        for name in _FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


def log_format(chosen: str | None) -> LogFormat:
    """The format asked for, else text. The entry point chooses between its option and
    CRONLOG_LOG_FORMAT (connectors/cli/common.py): this module reads no environment."""
    value = (chosen or "text").strip().lower()
    for known in FORMATS:
        if value == known:
            return known
    raise LogFormatError(f"the log format must be one of {', '.join(FORMATS)}, got {value!r}")


def configure(
    level: str, component: str, instance: str | None = None, fmt: str | None = None
) -> LogFormat:
    """Configure the root logger of this process (replacing any earlier setup)."""
    chosen = log_format(fmt)
    handler = logging.StreamHandler(sys.stderr)
    _routed[0] = chosen == "json"
    if chosen == "json":
        handler.setFormatter(JsonFormatter(component, instance))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    return chosen


_routed: list[bool] = [False]  # JSON configured in this process: librdkafka logs routed


def kafka_log_settings() -> dict[str, Any]:
    """Client settings that send librdkafka's log lines to the `librdkafka` logger, when
    this process logs JSON (in text format the library writes them itself)."""
    return {"logger": logging.getLogger("librdkafka")} if _routed[0] else {}
