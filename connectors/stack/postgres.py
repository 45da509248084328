"""PostgreSQL for the local stack: Debian's server packages, a private cluster run as the
``postgres`` user, a role and database ``cronlog``, loopback only.

The cluster lives under the state folder when the postgres user can reach it; a checkout
in a folder that user cannot enter (mode 0700 homes, mktemp dirs) gets its cluster under
/var/tmp instead, at a path derived from the state folder so every run finds it again.
"""

from __future__ import annotations

import glob
import hashlib
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from connectors.stack.paths import StackPaths
from connectors.stack.process import Log, StackError, port_open, run, wait_until

PORT = 15432
ROLE = "cronlog"
PASSWORD = "cronlog"  # loopback only; a development stack, not a production credential
DATABASE = "cronlog"
SERVER_USER = "postgres"


@dataclass(frozen=True, slots=True)
class PostgresStatus:
    running: bool
    database_url: str
    data_dir: str


def _server_bin() -> Path | None:
    """The newest installed server's bin dir (Debian layout), or pg_ctl on PATH."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
        key=lambda p: int(Path(p).parts[4]) if Path(p).parts[4].isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).resolve().parent if on_path else None


class PostgresStack:
    def __init__(self, paths: StackPaths, port: int = PORT):
        self.paths = paths
        self.port = port
        self.user = SERVER_USER if os.geteuid() == 0 else None  # initdb refuses root
        self.base = self._base_dir()
        self.data = self.base / "data"
        self.sockets = self.base / "run"
        self.logfile = self.base / "postgres.log"

    @property
    def database_url(self) -> str:
        return f"postgresql://{ROLE}:{PASSWORD}@127.0.0.1:{self.port}/{DATABASE}"

    def _base_dir(self) -> Path:
        preferred = self.paths.postgres
        if self.user is None or _user_can_enter(self.user, self.paths.state):
            return preferred
        tag = hashlib.sha256(str(self.paths.state).encode()).hexdigest()[:12]
        return Path("/var/tmp") / f"cronlog-postgres-{tag}"

    # -- status --------------------------------------------------------------------------
    def status(self) -> PostgresStatus:
        return PostgresStatus(self._running(), self.database_url, str(self.data))

    def _running(self) -> bool:
        bindir = _server_bin()
        if bindir is None or not (self.data / "PG_VERSION").exists():
            return False
        done = subprocess.run(
            [*self._as_server(), str(bindir / "pg_ctl"), "status", "-D", str(self.data)],
            capture_output=True,
            check=False,
        )
        return done.returncode == 0

    def _as_server(self) -> list[str]:
        return ["runuser", "-u", self.user, "--"] if self.user else []

    # -- up ------------------------------------------------------------------------------
    def up(self, log: Log = print) -> PostgresStatus:
        bindir = _server_bin() or self._install(log)
        if not self._running():
            self.check_port()
            self._init_cluster(bindir, log)
            log(f"starting PostgreSQL on 127.0.0.1:{self.port} (log: {self.logfile})")
            run(
                [
                    str(bindir / "pg_ctl"),
                    "start",
                    "-w",
                    "-t",
                    "60",
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.logfile),
                ],
                "starting PostgreSQL",
                user=self.user,
                timeout_s=90,
            )
        wait_until(self._accepts_superuser, 60, "PostgreSQL to accept connections")
        self._ensure_role_and_database()
        return self.status()

    def check_port(self) -> None:
        if port_open(self.port) and not self._running():
            raise StackError(
                f"port {self.port} is taken by another process, so the local "
                "PostgreSQL cannot start. Stop it, or point cronlog at an existing "
                "database with CRONLOG_DATABASE_URL."
            )

    def _install(self, log: Log) -> Path:
        apt = shutil.which("apt-get")
        if apt is None:
            raise StackError(
                "PostgreSQL server binaries are missing and apt-get is not available: "
                "install a PostgreSQL server (initdb, pg_ctl) or set CRONLOG_DATABASE_URL"
            )
        if os.geteuid() != 0:
            raise StackError(
                "PostgreSQL server binaries are missing; installing them needs root: "
                "sudo apt-get install postgresql"
            )
        # Debian's package would otherwise create and start a "main" cluster on 5432
        # that cronlog never uses.
        conf = Path("/etc/postgresql-common/createcluster.conf")
        if not conf.exists():
            conf.parent.mkdir(parents=True, exist_ok=True)
            conf.write_text("create_main_cluster = false\n")
        log("installing PostgreSQL from Debian's packages (first run only)")
        # Not configuration: this process's environment handed on to apt-get.
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        run([apt, "update", "-qq"], "apt-get update", env=env, timeout_s=600)
        run(
            [apt, "install", "-y", "-qq", "--no-install-recommends", "postgresql"],
            "apt-get install postgresql",
            env=env,
            timeout_s=900,
        )
        bindir = _server_bin()
        if bindir is None:
            raise StackError("apt-get installed postgresql but no pg_ctl was found")
        return bindir

    def _init_cluster(self, bindir: Path, log: Log) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        log(f"initialising a PostgreSQL cluster in {self.data}")
        self.base.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        if self.user:
            entry = pwd.getpwnam(self.user)
            for path in (self.base, self.sockets):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        os.chmod(self.base, 0o700)
        # Local socket: trust, but the socket dir is 0700 and owned by the server user.
        # TCP (loopback only): passwords.
        run(
            [
                str(bindir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                SERVER_USER,
                "-E",
                "UTF8",
                "--no-locale",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            ],
            "initdb",
            user=self.user,
            timeout_s=120,
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# cronlog local stack\n"
                "listen_addresses = '127.0.0.1'\n"
                f"port = {self.port}\n"
                f"unix_socket_directories = '{self.sockets}'\n"
                "max_connections = 200\n"
                "shared_buffers = 128MB\n"
            )

    def _superuser_conninfo(self) -> str:
        return f"host={self.sockets} port={self.port} user={SERVER_USER} dbname=postgres"

    def _accepts_superuser(self) -> bool:
        try:
            with psycopg.connect(self._superuser_conninfo(), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def _ensure_role_and_database(self) -> None:
        with psycopg.connect(self._superuser_conninfo(), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone():
                conn.execute(
                    sql.SQL("ALTER ROLE {} LOGIN CREATEDB PASSWORD {}").format(
                        sql.Identifier(ROLE), sql.Literal(PASSWORD)
                    )
                )
            else:
                # CREATEDB: the test harness gives every test module its own database.
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN CREATEDB PASSWORD {}").format(
                        sql.Identifier(ROLE), sql.Literal(PASSWORD)
                    )
                )
            if not conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
            ).fetchone():
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(DATABASE), sql.Identifier(ROLE)
                    )
                )

    # -- down ----------------------------------------------------------------------------
    def down(self) -> bool:
        bindir = _server_bin()
        if bindir is None or not self._running():
            return False
        run(
            [str(bindir / "pg_ctl"), "stop", "-w", "-t", "60", "-m", "fast", "-D", str(self.data)],
            "stopping PostgreSQL",
            user=self.user,
            timeout_s=90,
        )
        return True


def _user_can_enter(user: str, path: Path) -> bool:
    """Whether `user` can traverse every directory down to `path` (or its nearest parent)."""
    probe = path
    while not probe.exists():
        probe = probe.parent
    done = subprocess.run(
        ["runuser", "-u", user, "--", "test", "-x", str(probe)], capture_output=True, check=False
    )
    return done.returncode == 0
