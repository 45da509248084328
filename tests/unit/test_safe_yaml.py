"""Issue 53, item 6: YAML aliases in the files cronlog reads (connectors/safe_yaml.py).

594 bytes of nested aliases ("billion laughs") load as shared objects and ask for
gigabytes once walked: `apply -f`/`diff -f` ran orjson on them before any size limit, and
a CI step running `diff` died. Every YAML file of users or admins is now read with a
loader that measures a file as expanded before building anything and refuses one past a
bound (or a value containing itself), naming the file and line. The 594-byte attack
itself is played by tests/processes/test_yaml_bomb.py, in a child process whose address
space is bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from connectors import safe_yaml
from connectors.apply import JobFileError, read_files
from connectors.notifier import RoutesError, load_routes

LAUGHS = """\
job_id: bomb
schedule: {every: 60s}
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
command: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""


def test_the_bomb_is_small() -> None:
    assert len(LAUGHS.encode()) < 700


def test_read_files_refuses_a_bomb_in_a_directory_naming_file_and_line(tmp_path: Path) -> None:
    """A smaller bomb (the 594-byte one is played in a bounded child elsewhere), found in a
    directory: refused before expansion with the file and the line of the value that
    crosses the bound."""
    path = tmp_path / "jobs" / "small.yml"
    path.parent.mkdir()
    path.write_text(LAUGHS.replace("command: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]", "command: *h"))
    with pytest.raises(JobFileError, match=r"small\.yml:\d+: .*billion laughs"):
        read_files([tmp_path / "jobs"])


def test_a_value_that_contains_itself_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text("job_id: x\nschedule: {every: 60s}\ncommand: &c [x, *c]\n")
    with pytest.raises(JobFileError, match=r"jobs\.yaml:3: .*inside its own anchor"):
        read_files([path])


def test_aliases_a_dump_writes_are_read_as_before(tmp_path: Path) -> None:
    """PyYAML's dump writes &id001/*id001 for a value used twice: such files still apply."""
    schedule = {"every": "60s"}
    jobs = [{"job_id": j, "schedule": schedule, "command": ["x"]} for j in ("a", "b")]
    text = yaml.safe_dump({"owner": "team", "jobs": jobs})
    assert "*id001" in text
    path = tmp_path / "jobs.yaml"
    path.write_text(text)
    assert [job.spec.job_id for job in read_files([path]).jobs] == ["a", "b"]


def test_the_bound_is_per_file_across_its_documents() -> None:
    one = "a: &a [" + ",".join(["x" * 1000] * 1000) + "]\nb: [*a, *a, *a]\n"  # ~4 M each
    assert safe_yaml.safe_load(one)["b"][0][0] == "x" * 1000
    loader = safe_yaml.BoundedLoader(one + "---\n" + one)
    with pytest.raises(yaml.YAMLError, match="billion laughs"):
        _compose_all(loader)


def _compose_all(loader: safe_yaml.BoundedLoader) -> None:
    while loader.check_node():
        loader.get_node()


def test_the_notifiers_routes_file_refuses_a_bomb(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(LAUGHS.replace("command:", "owners:"))
    with pytest.raises(RoutesError, match=r"routes\.yaml.*billion laughs"):
        load_routes(path)


def test_the_shared_loader_refuses_the_bomb_with_a_yaml_error() -> None:
    with pytest.raises(yaml.YAMLError, match="billion laughs"):
        safe_yaml.safe_load(LAUGHS)
