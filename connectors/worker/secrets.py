"""Secrets a job's env names by reference (`{"secret": "NAME"}`), resolved on the worker.

A secret's value exists only here: in a file `<secrets dir>/NAME` (its content, one
trailing newline removed: what `echo value > NAME` or a mounted Kubernetes secret
gives), or in the worker's own environment as ``CRONLOG_SECRET_<NAME>`` (the name upper
case, `.` and `-` as `_`). The file wins. Names that share a variable (`db-pass`,
`DB.PASS`) are refused by the grants, and the variable is never served to a name while
the grants hold another with the same variable. Topics, projections, the API and the logs only
ever see the name. A secret the worker cannot find fails the attempt before it starts,
with the secret's name (not its value) as the reason.

A secret is an owner's (streams/core/secret_grants.py): `resolve` is given the job's
owner, and a secret the grants do not let that owner use fails the attempt the same way,
before any value is read. The ledger and the API refuse such a spec already; this is the
guarantee, here where the values are. The grants are the file CRONLOG_SECRETS_GRANTS
names, like the values read per run: a file replaced takes effect at the next run (a
grant revoked, say), and one that became unreadable or invalid fails every attempt that
names a secret (fail closed) until it is fixed. Settings read it at start: a bad file
stops the worker there.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from streams.core.secret_grants import ENV_VAR as GRANTS_ENV
from streams.core.secret_grants import SECRET_ENV_PREFIX, SecretGrants, refusal, secret_env_name
from streams.settings import SettingsError, read_secret_grants

ENV_PREFIX = SECRET_ENV_PREFIX
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class MissingSecret(Exception):
    """A secret the attempt cannot have: the attempt fails before it starts, with this
    (the secret's name, never its value) as the reason."""

    def __init__(self, name: str, where: str, message: str = ""):
        super().__init__(message or f"secret {name!r} is not available on this worker ({where})")
        self.name = name


class SecretNotGranted(MissingSecret):
    """The job's owner may not use the secret (or the grants cannot be read)."""

    def __init__(self, name: str, message: str):
        super().__init__(name, "", message)


def env_name(secret: str) -> str:
    return secret_env_name(secret)


class GrantsFile:
    """The grants file, parsed again whenever it changes (its inode, size or mtime)."""

    def __init__(self, path: Path | None):
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._grants = SecretGrants()
        self._error = ""

    def current(self) -> tuple[SecretGrants, str]:
        """The grants, and "" or why they cannot be read (then nothing is granted)."""
        if self.path is None:
            return SecretGrants(), ""
        try:
            st = self.path.stat()
        except OSError as exc:
            self._seen = None
            return SecretGrants(), f"{GRANTS_ENV}: cannot read {self.path}: {exc.strerror}"
        seen = (st.st_ino, st.st_size, st.st_mtime_ns)
        if seen != self._seen:
            self._seen = seen
            try:
                self._grants, self._error = read_secret_grants(str(self.path)), ""
            except SettingsError as exc:
                self._grants, self._error = SecretGrants(), str(exc)
        return self._grants, self._error


class Secrets:
    def __init__(
        self,
        directory: Path | None,
        environ: Mapping[str, str] | None = None,
        grants: SecretGrants | None = None,
    ):
        self.directory = directory
        # Not configuration: CRONLOG_SECRET_<NAME> is a lookup of runtime values (the
        # secrets jobs name), looked up per run in the worker's own environment; so is
        # the grants file CRONLOG_SECRETS_GRANTS names, read again when it changes
        # (`grants`, when given, is fixed: tests).
        self.environ = os.environ if environ is None else environ
        path = self.environ.get(GRANTS_ENV) or None
        self.grants_file = GrantsFile(None if path is None else Path(path))
        self.fixed = grants

    def resolve(self, refs: tuple[tuple[str, str], ...], owner: str) -> dict[str, str]:
        """The env values of (env name, secret name) references of a job of `owner`:
        every secret checked against the grants before any value is read."""
        grants, error = self._grants() if refs else (SecretGrants(), "")
        if refs:
            if error:
                raise SecretNotGranted(
                    refs[0][1],
                    f"secret {refs[0][1]!r} not resolved: the grants are "
                    f"unreadable on this worker ({error})",
                )
            for env, secret in grants.refused(owner, refs):
                raise SecretNotGranted(secret, refusal(owner, env, secret))
        return {name: self.value(secret, grants) for name, secret in refs}

    def _grants(self) -> tuple[SecretGrants, str]:
        return (self.fixed, "") if self.fixed is not None else self.grants_file.current()

    def value(self, secret: str, grants: SecretGrants | None = None) -> str:
        """`secret`'s value: its file, else its variable in the worker's environment,
        which is served only if no other name of the grants (`grants`, or the current
        ones) shares it: `DB.PASS` granted to one owner never reads `db-pass`'s value."""
        if not _NAME.fullmatch(secret):  # validated upstream; never a path outside the dir
            raise MissingSecret(secret, "not a valid secret name")
        if self.directory is not None:
            path = self.directory / secret
            try:
                return path.read_text().removesuffix("\n")
            except FileNotFoundError:
                pass
        sharing = (self._grants()[0] if grants is None else grants).sharing_env(secret)
        if sharing:
            raise MissingSecret(
                secret,
                "",
                f"secret {secret!r} not resolved from the worker's environment: its "
                f"variable {env_name(secret)} is also that of granted secret "
                f"{sharing[0]!r} (rename one in {GRANTS_ENV})",
            )
        found = self.environ.get(env_name(secret))
        if found is not None:
            return found
        where = f"no file {secret} in {self.directory}, " if self.directory else ""
        raise MissingSecret(secret, f"{where}no {env_name(secret)} in its environment")
