"""YAML of files users and admins write, read with its aliases' expansion bounded.

PyYAML's safe loader builds `&a [*b, *b, ...]` as shared objects, so a few hundred bytes
of nested aliases ("billion laughs") stay small until something walks them (orjson, a
comparison, a dump) and asks for gigabytes. Aliases themselves are legitimate (PyYAML's
own dump writes `&id001`/`*id001` for a value used twice), so the loader here lets them
be, but measures what each document would be with every alias written out, on the
composed nodes before anything is built, counting every node and every scalar's
characters: past MAX_EXPANDED for the file (far more than any file without aliases of a
few megabytes holds), or an alias inside its own anchor (a value containing itself), it
refuses with a YAML error whose mark gives the line (the callers name the file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_EXPANDED = 8_000_000  # nodes plus scalar characters, aliases written out, per file


class ExpansionError(ComposerError):
    """Aliases that would expand past the bound, or a value that contains itself."""


class BoundedLoader(yaml.SafeLoader):
    """The safe loader, with each document's size as expanded bounded (ExpansionError)."""

    expanded = 0  # what this loader's documents expand to so far

    def compose_document(self) -> Node | None:
        node = super().compose_document()
        if node is not None:
            self.expanded += expanded_size(node, MAX_EXPANDED - self.expanded)
            keys_as_written(node)
        return node


_BOOL = "tag:yaml.org,2002:bool"
_STR = "tag:yaml.org,2002:str"


def keys_as_written(root: Node) -> None:
    """Mapping keys YAML 1.1 reads as booleans though written as words (`on:`, `off:`,
    `yes:`, `no:`, `y:`, `n:`) read as those words: a webhook's `on: [failed]` is the
    key "on", not True ("Dict key must be str"). Only plain `true`/`false` stay booleans
    (YAML 1.2's rule); values are untouched. Each node is visited once (aliases share)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            for key, value in node.value:
                if (
                    isinstance(key, ScalarNode)
                    and key.tag == _BOOL
                    and key.style is None
                    and key.value.lower() not in ("true", "false")
                ):
                    key.tag = _STR
                stack.append(key)
                stack.append(value)
        elif isinstance(node, SequenceNode):
            stack.extend(node.value)


def expanded_size(root: Node, limit: int = MAX_EXPANDED) -> int:
    """`root`'s nodes and scalar characters with every alias written out, computed once
    per distinct node (aliases are shared nodes); ExpansionError past `limit` or for a
    node inside itself."""
    sizes: dict[int, int] = {}
    walking: set[int] = set()

    def size(node: Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in walking:
            raise ExpansionError(
                None, None, "a YAML alias inside its own anchor (a value that contains itself)",
                node.start_mark,
            )  # fmt: skip
        walking.add(key)
        total = 1
        if isinstance(node, ScalarNode):
            total += len(node.value)
        elif isinstance(node, SequenceNode):
            total += sum(size(item) for item in node.value)
        elif isinstance(node, MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        walking.discard(key)
        if total > limit:
            raise ExpansionError(
                None, None,
                f"with its aliases written out this file would hold more than "
                f"{MAX_EXPANDED:,} values and characters (YAML aliases expanding without "
                "bound, a 'billion laughs'): refused before expanding it",
                node.start_mark,
            )  # fmt: skip
        sizes[key] = total
        return total

    return size(root)


def safe_load(text: str) -> Any:
    """One YAML (or JSON) document, its expansion bounded (yaml.YAMLError)."""
    loader = BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_file(path: str | Path) -> Any:
    """The one document of a file, its expansion bounded: OSError, or yaml.YAMLError."""
    return safe_load(Path(path).read_text())
