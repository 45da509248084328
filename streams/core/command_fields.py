"""The field readers of command validation (streams/core/commands.py): a command
document's fields read one by one, bounded and typed, and the messages a Rejection gives.

A reader raises `_Invalid` (reason, dotted field path) at the first thing wrong; the
entry points turn it into a Rejection, so nothing here raises out of validation. The
names keep their leading underscore: they are command validation's own
(streams/core/commands.py and streams/core/command_spec.py), for no other module.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Final, TypeAlias, TypeVar

MAX_JOB_ID_CHARS: Final = 128
MAX_REQUEST_ID_CHARS: Final = 128
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
_ID_RULE = "start with a letter or digit and contain only letters, digits, '.', '_' or '-'"


class _Invalid(Exception):
    def __init__(self, reason: str, field: str | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


_Doc: TypeAlias = dict[str, object]
_T = TypeVar("_T", bound=str)


def _required(doc: _Doc, key: str) -> object:
    value = doc.get(key)
    if value is None:
        raise _Invalid(f"missing required field '{key}'", key)
    return value


def _only(doc: _Doc, allowed: tuple[str, ...], prefix: str) -> None:
    for key in doc:
        if not isinstance(key, str):
            raise _Invalid(f"field names must be strings, got {_kind(key)}", prefix or None)
        if key not in allowed:
            close = difflib.get_close_matches(key[:64], allowed, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            path = _path(prefix, key)
            raise _Invalid(
                f"unknown field {_show(path)}; {hint}expected one of {_list(allowed)}", path
            )


def _object(value: object, path: str, max_items: int) -> _Doc:
    """An optional JSON object (None: empty) with string keys and at most max_items entries."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Invalid(f"{path} must be an object, got {_kind(value)}", path)
    if len(value) > max_items:
        raise _Invalid(f"{path} must have at most {max_items} entries, got {len(value)}", path)
    for key in value:
        if not isinstance(key, str):
            raise _Invalid(f"{path} keys must be strings, got {_kind(key)}", path)
    return value


def _array(value: object, path: str, max_items: int) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise _Invalid(f"{path} must be a list, got {_kind(value)}", path)
    if len(value) > max_items:
        raise _Invalid(f"{path} must have at most {max_items} elements, got {len(value)}", path)
    return list(value)


def _text(value: object, path: str, max_chars: int) -> str:
    """A string without NUL characters that encodes as UTF-8."""
    if not isinstance(value, str):
        raise _Invalid(f"{path} must be a string, got {_kind(value)}", path)
    if len(value) > max_chars:
        raise _Invalid(f"{path} must be at most {max_chars} characters, got {len(value)}", path)
    if "\x00" in value:
        raise _Invalid(f"{path} must not contain NUL characters", path)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Invalid(f"{path} is not valid Unicode text", path) from None
    return value


def _identifier(value: object, path: str, max_chars: int, what: str) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"{what} must be a string, got {_kind(value)}", path)
    if not 1 <= len(value) <= max_chars:
        raise _Invalid(f"{what} must be 1 to {max_chars} characters, got {len(value)}", path)
    if not _ID.fullmatch(value):
        raise _Invalid(f"{what} must {_ID_RULE}, got {_show(value)}", path)
    return value


def _job_id(value: object, path: str) -> str:
    return _identifier(value, path, MAX_JOB_ID_CHARS, path)


def _request_id(doc: _Doc) -> str:
    return _identifier(
        _required(doc, "request_id"), "request_id", MAX_REQUEST_ID_CHARS, "request_id"
    )


def _bool(doc: _Doc, key: str, default: bool) -> bool:
    value = doc.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _Invalid(f"{key} must be true or false, got {_kind(value)}", key)
    return value


def _int(doc: _Doc, key: str, default: int, lo: int, hi: int, *, prefix: str = "") -> int:
    path, value = _path(prefix, key), doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(f"{path} must be an integer, got {_kind(value)}", path)
    _bounds(path, value, lo, hi)
    return value


def _number(
    doc: _Doc,
    key: str,
    default: float,
    lo: int,
    hi: int,
    *,
    prefix: str = "",
    positive: bool = False,
) -> float:
    path, value = _path(prefix, key), doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid(f"{path} must be a number, got {_kind(value)}", path)
    if not math.isfinite(value):
        raise _Invalid(f"{path} must be a finite number, got {_show(value)}", path)
    if positive and value <= 0:
        raise _Invalid(f"{path} must be > 0, got {_show(value)}", path)
    _bounds(path, value, lo, hi)
    return float(value)


def _bounds(path: str, value: float, lo: int, hi: int) -> None:
    if value < lo:
        raise _Invalid(f"{path} must be >= {lo}, got {_show(value)}", path)
    if value > hi:
        raise _Invalid(f"{path} must be <= {hi}, got {_show(value)}", path)


def _choice(doc: _Doc, key: str, options: tuple[_T, ...], default: _T) -> _T:
    value = doc.get(key)
    if value is None:
        return default
    for option in options:
        if value == option and isinstance(value, str):
            return option
    shown = _show(value) if isinstance(value, str) else _kind(value)
    raise _Invalid(f"{key} must be one of {_list(options)}, got {shown}", key)


# --- messages -----------------------------------------------------------------------------


def _path(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _list(options: tuple[str, ...]) -> str:
    return ", ".join(options)


def _kind(value: object) -> str:
    """The JSON name of a value's type."""
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    names |= {list: "array", tuple: "array", dict: "object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _clip(message: str, limit: int = 300) -> str:
    return message if len(message) <= limit else message[:limit] + "…"


def _show(value: object) -> str:
    """A short repr of a scalar for messages (reasons land in the DLQ: keep them bounded)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "a very large integer"
    if not isinstance(value, str | int | float | bool | None):
        return _kind(value)
    return repr(value[:80] + "…" if isinstance(value, str) and len(value) > 80 else value)
