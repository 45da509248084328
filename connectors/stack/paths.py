"""Where the native stack keeps its files (a state folder, by default ``.state`` in the
current directory) and where cronlog's own data files are (package data, found through
importlib.resources, so an installed wheel works from any directory)."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path


def _package_file(package: str, *parts: str) -> Path:
    """A data file shipped in ``package``, as a real path: Maven and the JVM are handed
    these paths, so the package must sit on the file system (pip always installs so)."""
    resource = files(package).joinpath(*parts)
    if not isinstance(resource, Path):
        raise RuntimeError(
            f"cronlog's data file {package}/{'/'.join(parts)} is not on the file system "
            f"({resource!r}): install cronlog with pip, not as a zip"
        )
    return resource


# The native stack's Kafka assets: pom.xml, server.properties.in, log4j2.properties.
KAFKA_ASSETS = _package_file("compose", "kafka")
# The jobs `cronlog run` registers by default.
DEMO = _package_file("examples", "demo.yaml")
DEFAULT_STATE_DIR = ".state"


@dataclass(frozen=True, slots=True)
class StackPaths:
    state: Path
    # The fetched jars can be shared between state folders (tests start a second stack).
    libs: Path | None = None

    @classmethod
    def default(cls, state_dir: str | None = None) -> StackPaths:
        """``state_dir`` (CRONLOG_STATE_DIR) or ``.state`` in the current directory: in a
        checkout, run from its root as `make` does, that is the checkout's ``.state``."""
        return cls(Path(state_dir or DEFAULT_STATE_DIR).resolve())

    @property
    def kafka(self) -> Path:
        return self.state / "kafka"

    @property
    def kafka_secure(self) -> Path:
        return self.state / "kafka-secure"

    @property
    def kafka_libs(self) -> Path:
        return self.libs or self.state / "kafka-libs"

    @property
    def postgres(self) -> Path:
        return self.state / "postgres"
