"""Secrets a job's env names by reference (`{"secret": "NAME"}`), resolved on the worker.

A secret's value exists only here: in a file `<secrets dir>/NAME` (its content, one
trailing newline removed: what `echo value > NAME` or a mounted Kubernetes secret
gives), or in the worker's own environment as ``CRONLOG_SECRET_<NAME>`` (the name upper
case, `.` and `-` as `_`). The file wins. Topics, projections, the API and the logs only
ever see the name. A secret the worker cannot find fails the attempt before it starts,
with the secret's name (not its value) as the reason.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

ENV_PREFIX = "CRONLOG_SECRET_"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class MissingSecret(Exception):
    def __init__(self, name: str, where: str):
        super().__init__(f"secret {name!r} is not available on this worker ({where})")
        self.name = name


def env_name(secret: str) -> str:
    return ENV_PREFIX + re.sub(r"[.-]", "_", secret).upper()


class Secrets:
    def __init__(self, directory: Path | None, environ: Mapping[str, str] | None = None):
        self.directory = directory
        # Not configuration: CRONLOG_SECRET_<NAME> is a lookup of runtime values (the
        # secrets jobs name), looked up per run in the worker's own environment.
        self.environ = os.environ if environ is None else environ

    def resolve(self, refs: tuple[tuple[str, str], ...]) -> dict[str, str]:
        """The env values of (env name, secret name) references."""
        return {name: self.value(secret) for name, secret in refs}

    def value(self, secret: str) -> str:
        if not _NAME.fullmatch(secret):  # validated upstream; never a path outside the dir
            raise MissingSecret(secret, "not a valid secret name")
        if self.directory is not None:
            path = self.directory / secret
            try:
                return path.read_text().removesuffix("\n")
            except FileNotFoundError:
                pass
        found = self.environ.get(env_name(secret))
        if found is not None:
            return found
        where = f"no file {secret} in {self.directory}, " if self.directory else ""
        raise MissingSecret(secret, f"{where}no {env_name(secret)} in its environment")
