"""cronlog installed from its wheel, as a user without the checkout gets it: the wheel is
built, installed into a fresh venv in a temporary directory, and the quick start runs
from another temporary directory. The venv imports nothing from the checkout (no
PYTHONPATH, the checkout not on sys.path), so every data file it needs (the stack's pom,
broker config and log config, the migrations, the Avro schemas, the demo) must come from
the wheel.

The dependencies come from PyPI once and are kept in a wheelhouse in the state folder, at
the versions of the dev venv; later runs install offline from it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from confluent_kafka.admin import AdminClient

from connectors.stack import Stack, StackPaths, StackPorts
from streams.settings import Settings
from streams.topics import CATALOGUE
from tests.support.ports import free_port
from tests.support.services import Services
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
KAFKA_ASSETS = ("log4j2.properties", "pom.xml", "server.properties.in")
DEMO = {"demo-cron", "demo-every-10s", "demo-extract", "demo-transform", "demo-load", "demo-flaky"}
# Not copied for the build: local state, venvs, caches and earlier build outputs (a stale
# build/ would leak deleted files into the wheel).
NOT_SOURCES = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".state",
    "build",
    "dist",
    "*.egg-info",
    "*.whl",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
    ".schemathesis",
)


@dataclass(frozen=True, slots=True)
class Installed:
    venv: Path

    @property
    def cronlog(self) -> str:
        return str(self.venv / "bin" / "cronlog")

    def env(self, settings: Settings | None = None, **extra: str) -> dict[str, str]:
        """A user's environment: the venv's bin on PATH, nothing pointing at the checkout,
        no CRONLOG_STATE_DIR unless given (so the state folder defaults to the cwd)."""
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("CRONLOG_")
        }
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        if settings is not None:
            env |= {
                "CRONLOG_KAFKA": settings.kafka,
                "CRONLOG_DATABASE_URL": settings.database_url,
                "CRONLOG_TOPIC_PREFIX": settings.topic_prefix,
                "CRONLOG_PARTITIONS": str(settings.partitions),
            }
        return env | extra

    def run(
        self, *args: str, cwd: Path, env: dict[str, str], timeout_s: float = 180
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s
        )


def _pip(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _must(done: subprocess.CompletedProcess[str], what: str) -> None:
    assert done.returncode == 0, f"{what} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def _offline_else_fetch(wheelhouse: Path, what: str, offline: list[str], fetch: list[str]) -> None:
    """Run pip offline from the wheelhouse; if something is missing there (first run, a
    new dependency), download what ``fetch`` names into it from PyPI and run again."""
    local = ["--no-index", "--find-links", str(wheelhouse)]
    if _pip(*offline, *local).returncode != 0:
        _must(_pip("download", "-d", str(wheelhouse), *fetch), f"pip download for {what}")
        _must(_pip(*offline, *local), what)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    base = tmp_path_factory.mktemp("install")
    wheelhouse = StackPaths.default(os.environ.get("CRONLOG_STATE_DIR")).state / "wheelhouse"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    # Build from a copy: an in-tree build writes build/ into the shared work tree.
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES, symlinks=True)
    wheels = base / "wheels"
    build_requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]
    _offline_else_fetch(
        wheelhouse,
        "pip wheel",
        ["wheel", str(source), "--no-deps", "-w", str(wheels)],
        list(build_requires["requires"]),
    )
    (wheel,) = wheels.glob("cronlog-*.whl")

    venv = base / "venv"
    # --without-pip: the dev venv's pip installs into it (pip --python), which is quicker.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # The dev venv's versions, so the wheelhouse serves every run.
    frozen = _pip("freeze", "--exclude", "cronlog", "--exclude-editable")
    _must(frozen, "pip freeze")
    constraints = base / "constraints.txt"
    constraints.write_text(frozen.stdout)
    pinned = ["-c", str(constraints), str(wheel)]
    _offline_else_fetch(
        wheelhouse,
        "pip install of the wheel",
        ["--python", str(venv / "bin" / "python"), "install", "--no-compile", *pinned],
        pinned,
    )
    return Installed(venv)


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A working directory outside the checkout."""
    where = tmp_path / "elsewhere"
    where.mkdir()
    assert not where.resolve().is_relative_to(ROOT)
    return where


PROBE = """
import json, yaml
import connectors, compose, examples
from connectors.stack.paths import DEMO, KAFKA_ASSETS
from projections.migrate import MIGRATIONS_DIR
from schemas.registry import AVRO_DIR, load_all
print(json.dumps({
    "modules": [m.__file__ for m in (connectors, compose, examples)],
    "kafka": {p.name: p.read_text() for p in KAFKA_ASSETS.iterdir()},
    "demo": yaml.safe_load(DEMO.read_text()),
    "migrations": sorted(p.name for p in MIGRATIONS_DIR.glob("*.sql")),
    "avro_dir": str(AVRO_DIR),
    "schemas": sorted(load_all()),
}))
"""


def test_the_wheel_carries_its_data_and_the_quick_start_runs_outside_the_checkout(
    installed: Installed, settings: Settings, elsewhere: Path
) -> None:
    env = installed.env(settings)
    helped = installed.run(installed.cronlog, "--help", cwd=elsewhere, env=env)
    _must(helped, "cronlog --help")
    assert "CRONLOG_KAFKA" in helped.stdout

    probe = installed.run(
        str(installed.venv / "bin" / "python"), "-c", PROBE, cwd=elsewhere, env=env
    )
    _must(probe, "the probe")
    found: dict[str, Any] = json.loads(probe.stdout)
    for module in found["modules"]:
        assert Path(module).is_relative_to(installed.venv), module  # not the checkout
    assert Path(found["avro_dir"]).is_relative_to(installed.venv)
    assert sorted(found["kafka"]) == sorted(KAFKA_ASSETS)
    for name, text in found["kafka"].items():
        assert text == (ROOT / "compose" / "kafka" / name).read_text(), name
    assert {job["job_id"] for job in found["demo"]["jobs"]} == DEMO
    shipped = sorted(p.name for p in (ROOT / "projections" / "migrations").glob("*.sql"))
    assert found["migrations"] == shipped
    assert found["schemas"]  # every topic schema with its history loaded from the wheel

    _must(installed.run(installed.cronlog, "topics", "create", cwd=elsewhere, env=env), "topics")
    topics = AdminClient({"bootstrap.servers": settings.kafka}).list_topics(timeout=30).topics
    assert {settings.topic(spec.name) for spec in CATALOGUE} <= set(topics)

    _must(installed.run(installed.cronlog, "db", "migrate", cwd=elsewhere, env=env), "db migrate")
    with psycopg.connect(settings.database_url) as conn:
        versions = conn.execute("SELECT count(*) FROM schema_migrations").fetchone()
        assert versions == (len(shipped),)
        for table in ("jobs", "runs", "run_transitions", "workers", "run_logs"):
            assert conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() != (None,), table
    assert not (elsewhere / ".state").exists()  # neither command needs a state folder


def test_cronlog_run_from_any_directory_registers_and_runs_the_demo(
    installed: Installed, settings: Settings, elsewhere: Path
) -> None:
    out = elsewhere / "run.out"
    port = str(free_port())
    # --no-stack: the shared stack serves CRONLOG_KAFKA and CRONLOG_DATABASE_URL (a
    # second one cannot take its ports); `stack up` from elsewhere is the next test.
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [installed.cronlog, "run", "--no-stack", "--loglevel", "warning", "--api-port", port],
            cwd=elsewhere,
            env=installed.env(settings),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        eventually(lambda: "registered 6 demo jobs" in out.read_text(), "the demo", 120)
        # The state folder defaults to .state in the current directory.
        tokens = yaml.safe_load((elsewhere / ".state" / "api-tokens.yaml").read_text())
        assert tokens["admin"]
        assert (elsewhere / ".state" / "logs").is_dir()

        def demo_jobs() -> set[str]:
            with psycopg.connect(settings.database_url) as conn:
                rows = conn.execute("SELECT job_id FROM jobs WHERE owner = 'demo'").fetchall()
            return {r[0] for r in rows}

        eventually(lambda: demo_jobs() == DEMO, "the demo jobs in SQL", 60)

        def succeeded() -> bool:
            with psycopg.connect(settings.database_url) as conn:
                query = "SELECT 1 FROM runs WHERE job_id = 'demo-every-10s' AND state = 'succeeded'"
                return conn.execute(query).fetchone() is not None

        # A run succeeds: the workers' executors import cronlog from the venv too.
        eventually(succeeded, "a succeeded run of demo-every-10s", 90)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            raise
    assert code == 0, out.read_text()[-3000:]


@pytest.fixture
def private_ports() -> StackPorts:
    return StackPorts(free_port(), free_port(), free_port())


def test_stack_up_from_any_directory_uses_the_packaged_assets(
    installed: Installed, services: Services, elsewhere: Path, private_ports: StackPorts
) -> None:
    if services.source != "native":
        pytest.skip(f"services come from {services.source}, not the native stack")
    state = elsewhere / ".state"
    state.mkdir()
    # The shared jars, so mvn is not run again: their stamp is the digest of the pom, so
    # this also checks that the packaged pom is the one they were fetched for.
    shared = StackPaths.default(os.environ.get("CRONLOG_STATE_DIR"))
    (state / "kafka-libs").symlink_to(shared.kafka_libs, target_is_directory=True)
    env = installed.env(
        CRONLOG_STACK_KAFKA_PORT=str(private_ports.kafka),
        CRONLOG_STACK_CONTROLLER_PORT=str(private_ports.controller),
        CRONLOG_STACK_POSTGRES_PORT=str(private_ports.postgres),
    )
    stack = Stack(StackPaths(state.resolve()), private_ports)
    try:
        up = installed.run(installed.cronlog, "stack", "up", cwd=elsewhere, env=env, timeout_s=300)
        _must(up, "cronlog stack up")
        assert "fetching the Kafka jars" not in up.stderr
        status = installed.run(
            installed.cronlog, "stack", "status", "--json", cwd=elsewhere, env=env
        )
        _must(status, "cronlog stack status")
        found = json.loads(status.stdout)
        assert found["kafka_running"], found
        assert found["postgres_running"], found
        assert found["state_dir"] == str(state.resolve())
        assert found["kafka"] == f"127.0.0.1:{private_ports.kafka}"
        rendered = list((state / "kafka").rglob("server.properties"))
        assert rendered, "no broker config rendered from the packaged template"
        assert f"127.0.0.1:{private_ports.kafka}" in rendered[0].read_text()
        metadata = AdminClient({"bootstrap.servers": found["kafka"]}).list_topics(timeout=30)
        assert metadata.brokers
        with psycopg.connect(found["database_url"], connect_timeout=10) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        down = installed.run(installed.cronlog, "stack", "down", cwd=elsewhere, env=env)
        _must(down, "cronlog stack down")
    finally:
        stack.down()  # a no-op after a successful `stack down`
        shutil.rmtree(stack.postgres.base, ignore_errors=True)
