"""Where the native stack keeps its files: a project-local state folder, git-ignored."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = REPO_ROOT / "compose"


@dataclass(frozen=True, slots=True)
class StackPaths:
    state: Path
    # The fetched jars can be shared between state folders (tests start a second stack).
    libs: Path | None = None

    @classmethod
    def default(cls, state_dir: str | None = None) -> StackPaths:
        return cls(Path(state_dir).resolve() if state_dir else REPO_ROOT / ".state")

    @property
    def kafka(self) -> Path:
        return self.state / "kafka"

    @property
    def kafka_libs(self) -> Path:
        return self.libs or self.state / "kafka-libs"

    @property
    def postgres(self) -> Path:
        return self.state / "postgres"
