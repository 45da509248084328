"""Run parameters, pure: what a job declares, what a run is given, what the run gets.

A job declares its parameters with a type and, optionally, a default (a parameter without
one must be given to every run, so a job with a schedule or upstreams gives every one a
default). A run-now or a backfill may pass values; each run keeps the values it runs with
(the given ones over the defaults), and its process receives them as one JSON object in
`CRONLOG_PARAMS` and, when the job says `params_in_command`, in place of `{name}` in its
argv (`{{` and `}}` stand for a brace).

Values travel as canonical JSON texts (`10`, `"2026-12-01"`, `true`), so a value's type
survives every topic and table unchanged.

Every limit is checked on what will be written (`written`): the argv after substitution
and the environment with the values, not the command as registered. Twenty kilobytes of
`{v}` and one kilobyte value are a 64 KiB command once substituted, and a dispatch
request of megabytes, which no topic takes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, get_args

import orjson

from schemas.spec import JobSpec, Param, ParamType

ParamValues = tuple[tuple[str, str], ...]  # sorted (name, JSON text) pairs

PARAM_TYPES: tuple[str, ...] = get_args(ParamType)
MAX_PARAMS = 32
MAX_VALUE_CHARS = 1024  # a string value
MAX_VALUES_BYTES = 8192  # all of a run's values, as JSON
ENV_NAME = "CRONLOG_PARAMS"
# A dispatched command as written (argv after substitution, env with CRONLOG_PARAMS), in
# UTF-8 bytes: the size a command may have (commands.MAX_COMMAND_BYTES), so a dispatch
# request stays far below what its topic takes (1 MB).
MAX_WRITTEN_BYTES = 64 * 1024
# What one argument and one variable may hold, as the registration checks them
# (command_spec.MAX_ARG_CHARS, MAX_ENV_VALUE_CHARS: the parser imports this module, so the
# values are repeated here; tests/unit/test_params_written.py holds them equal).
MAX_ARG_CHARS = 32 * 1024
MAX_ENV_VALUE_CHARS = 32 * 1024
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")


class ParamError(ValueError):
    """A declaration or value refused: `field` names where (params.NAME)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def _canonical(value: object, path: str) -> str:
    """A scalar value as its JSON text; anything else refused."""
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS:
            raise ParamError(f"{path} must be at most {MAX_VALUE_CHARS} characters", path)
        if "\x00" in value:
            raise ParamError(f"{path} must not contain NUL", path)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ParamError(f"{path} must be a finite number", path)
    elif value is not None and not isinstance(value, bool | int | float):
        raise ParamError(f"{path} must be a string, number or boolean", path)
    if value is None:
        raise ParamError(f"{path} must be a string, number or boolean, not null", path)
    return orjson.dumps(value).decode()


def _a(kind: str) -> str:
    return f"an {kind}" if kind == "integer" else f"a {kind}"


def _matches(kind: ParamType, value: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse_declarations(value: object) -> tuple[Param, ...]:
    """`params` of a job: {name: {"type": T, "default": V}} (default optional)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ParamError("params must be an object of name: {type, default}", "params")
    if len(value) > MAX_PARAMS:
        raise ParamError(f"params may declare at most {MAX_PARAMS} parameters", "params")
    declared = []
    for name, decl in value.items():
        path = f"params.{name}"
        if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > 64:
            raise ParamError(
                f"{path}: a name starts with a letter or _ and holds letters, digits, _", path
            )
        if not isinstance(decl, dict) or not set(decl) <= {"type", "default"}:
            raise ParamError(f"{path} must be an object with type and, optionally, default", path)
        kind = decl.get("type")
        if kind not in PARAM_TYPES:
            raise ParamError(f"{path}.type must be one of {', '.join(PARAM_TYPES)}", path)
        default = None
        if "default" in decl:
            if not _matches(kind, decl["default"]):
                raise ParamError(f"{path}.default must be {_a(kind)}", path)
            default = _canonical(decl["default"], f"{path}.default")
        declared.append(Param(name, kind, default))
    return tuple(sorted(declared, key=lambda p: p.name))


def declarations_document(params: tuple[Param, ...]) -> dict[str, dict[str, Any]]:
    """The `params` value of a command that declares `params` (inverse of parsing)."""
    return {
        p.name: {
            "type": p.type,
            **({} if p.default is None else {"default": orjson.loads(p.default)}),
        }
        for p in params
    }


def parse_values(value: object) -> ParamValues:
    """The `params` a run-now or backfill passes: an object of scalar values (their
    types are checked against the job's declaration by `resolve`)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ParamError("params must be an object of name: value", "params")
    if len(value) > MAX_PARAMS:
        raise ParamError(f"params may pass at most {MAX_PARAMS} values", "params")
    values = []
    for name, given in value.items():
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ParamError(f"params: {name!r} is not a parameter name", "params")
        values.append((name, _canonical(given, f"params.{name}")))
    total = sum(len(n) + len(v) + 4 for n, v in values)
    if total > MAX_VALUES_BYTES:
        raise ParamError(f"params are {total} bytes of JSON; at most {MAX_VALUES_BYTES}", "params")
    return tuple(sorted(values))


def _loaded(text: str, path: str) -> Any:
    """A value's JSON text read back; text that is not JSON (written to the log past
    the command parser) is refused, never raised as something else."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        raise ParamError(f"{path} is not a JSON value: {text[:40]!r}", path) from None


def resolve(declared: tuple[Param, ...], given: ParamValues) -> ParamValues:
    """A run's values: the given ones, typed as declared, over the defaults. Refused: a
    name the job does not declare, a value of another type, a parameter without a
    default that is not given."""
    by_name = {p.name: p for p in declared}
    values = dict(given)
    for name, text in given:
        param = by_name.get(name)
        if param is None:
            known = ", ".join(by_name) or "none"
            raise ParamError(
                f"params.{name}: the job declares no such parameter ({known})", f"params.{name}"
            )
        if not _matches(param.type, _loaded(text, f"params.{name}")):
            raise ParamError(f"params.{name} must be {_a(param.type)}", f"params.{name}")
    for param in declared:
        if param.name not in values:
            if param.default is None:
                raise ParamError(
                    f"params.{param.name} is required (it has no default)", f"params.{param.name}"
                )
            default = _loaded(param.default, f"params.{param.name}.default")
            if not _matches(param.type, default):
                where = f"params.{param.name}"
                raise ParamError(f"{where}.default must be {_a(param.type)}", where)
            values[param.name] = param.default
    return tuple(sorted(values.items()))


def required(declared: tuple[Param, ...]) -> list[str]:
    """The parameters without a default: no scheduled run can give them."""
    return [p.name for p in declared if p.default is None]


def as_env(values: ParamValues) -> str:
    """The run's values as the JSON object `CRONLOG_PARAMS` holds."""
    return "{" + ",".join(f"{orjson.dumps(n).decode()}:{v}" for n, v in values) + "}"


def as_text(text: str) -> str:
    """A value as it goes into argv: a string as itself, anything else as its JSON."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text  # resolved values are JSON: this is only a guard
    return value if isinstance(value, str) else text


def substitute(argv: tuple[str, ...], values: ParamValues) -> tuple[str, ...]:
    """`{name}` in each argument replaced by the value's text; `{{`/`}}` are braces; a
    name the run has no value for stays as written."""
    by_name = dict(values)

    def one(match: re.Match[str]) -> str:
        token = match.group(0)
        if token in ("{{", "}}"):
            return token[0]
        name = match.group(1)
        return as_text(by_name[name]) if name in by_name else token

    return tuple(_PLACEHOLDER.sub(one, arg) for arg in argv)


def values_document(values: ParamValues) -> dict[str, Any]:
    """The values as a JSON object (API, projections)."""
    return {n: orjson.loads(v) for n, v in values}


def as_mapping(values: Mapping[str, str] | ParamValues) -> ParamValues:
    items = values.items() if isinstance(values, Mapping) else values
    return tuple(sorted(items))


def written(
    spec: JobSpec, values: ParamValues
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The argv and env a run with `values` is dispatched with: the values in
    `CRONLOG_PARAMS` and, with `params_in_command`, in place of `{name}`. Every limit is
    checked on them as written (ParamError naming it): an argument at most
    MAX_ARG_CHARS, the values' variable at most MAX_ENV_VALUE_CHARS, and argv and env
    together at most MAX_WRITTEN_BYTES. Without values the command is the one the
    registration checked."""
    command, env = spec.command, spec.env
    if not values:
        return command, env
    variable = as_env(values)
    if len(variable) > MAX_ENV_VALUE_CHARS:
        raise ParamError(
            f"params: {ENV_NAME} would be {len(variable)} characters; at most "
            f"{MAX_ENV_VALUE_CHARS}",
            "params",
        )
    env = tuple(sorted((*env, (ENV_NAME, variable))))
    if spec.params_in_command:
        command = substitute(command, values)
        for index, arg in enumerate(command):
            if len(arg) > MAX_ARG_CHARS:
                raise ParamError(
                    f"params: command[{index}] with the run's values in place of its "
                    f"{{name}} would be {len(arg)} characters; at most {MAX_ARG_CHARS}",
                    "params",
                )
    size = sum(len(a.encode()) for a in command)
    size += sum(len(n.encode()) + len(v.encode()) for n, v in env)
    if size > MAX_WRITTEN_BYTES:
        raise ParamError(
            f"params: the command as dispatched (argv with the run's values in place of "
            f"{{name}}, env with {ENV_NAME}) would be {size} bytes; at most "
            f"{MAX_WRITTEN_BYTES}",
            "params",
        )
    return command, env
