"""The Python client and the CLI's API mode against the real API (issue 37): a team member
with a token and nothing else (no Kafka or database settings in the CLI's environment)
registers, runs, waits for and reads jobs; every refusal arrives as the API words it,
typed in Python and with a testable exit code on the command line."""

from __future__ import annotations

import stat
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from connectors.client import (
    Client,
    Conflict,
    Invalid,
    NotFound,
    Unauthorized,
    WaitTimeout,
)
from streams.settings import Settings
from tests.support.kafka import consumer
from tests.support.nodes import (
    CronlogProcess,
    Node,
    ProjectorProc,
    WorkerProc,
    cli_with_only,
    env_for,
    send_commands,
    stop_all,
)
from tests.support.ports import free_port
from tests.support.waiting import eventually

TOKENS = {
    "CRONLOG_API_TOKENS": "tok-ca-0123456789ab=team-ca,tok-cb-0123456789ab=team-cb",
    "CRONLOG_API_ADMIN_TOKENS": "tok-cadmin-0123456789ab",
}
TOKEN_A = "tok-ca-0123456789ab"
TOKEN_B = "tok-cb-0123456789ab"
TOKEN_ADMIN = "tok-cadmin-0123456789ab"
LATER = {"at": "2099-01-01T00:00:00Z"}  # runs only when asked


@pytest.fixture(scope="module")
def url(topics: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs: Path = tmp_path_factory.mktemp("client")
    port = free_port()
    procs: list[CronlogProcess] = [
        Node(topics, "client-n1", logs),
        WorkerProc(topics, "client-w1", logs, cpu=2, memory_mb=512),
        ProjectorProc(topics, logs / "projector.log"),
        CronlogProcess(
            topics,
            "client-api",
            logs,
            ["api", "--port", str(port), "--loglevel", "warning"],
            extra_env=TOKENS,
        ),
    ]
    for proc in procs:
        proc.start()
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(f"{base}/readyz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        eventually(ready, "the API to be ready")
        yield base
    finally:
        stop_all(reversed(procs))


def test_a_job_registered_run_waited_for_and_read_through_the_client(url: str) -> None:
    with Client(url, TOKEN_A) as api:
        job = {"job_id": "cl-hello", "schedule": LATER, "command": ["sh", "-c", "echo hi $X"]}
        first = api.put_job({**job, "env": {"X": "one"}})
        assert first.body["job_id"] == "cl-hello"
        eventually(lambda: _exists(api, "cl-hello"), "the job registered")
        # Put again: the job is replaced by the new spec, not refused as existing.
        api.put_job({**job, "env": {"X": "two"}})
        eventually(lambda: api.job("cl-hello").spec["env"] == {"X": "two"}, "the change")
        seen = api.job("cl-hello")
        assert seen.owner == "team-ca"
        assert not seen.paused
        assert seen.cycle == ()

        run = api.run_now("cl-hello", request_id="deploy-1")
        again = api.run_now("cl-hello", request_id="deploy-1")
        assert again.run_id == run.run_id  # the same key, the same run
        done = api.wait(run.run_id, timeout_s=60)
        assert done.state == "succeeded"
        assert done.exit_code == 0
        assert api.logs(run.run_id) == "hi two\n"
        states = [t.state for t in api.events(run.run_id)]
        assert states[0] == "due"
        assert states[-1] == "succeeded"
        assert "running" in states
        assert run.run_id in {r.run_id for r in api.runs(job_id="cl-hello")}
        assert [r.run_id for r in api.runs(job_id="cl-hello", state="succeeded")] == [run.run_id]

        api.pause("cl-hello")
        eventually(lambda: api.job("cl-hello").paused, "the pause")
        api.resume("cl-hello")
        eventually(lambda: not api.job("cl-hello").paused, "the resume")
        assert "cl-hello" in {j.job_id for j in api.jobs()}


def test_waiting_gives_up_with_the_run_as_it_was_and_a_cancel_ends_it(url: str) -> None:
    with Client(url, TOKEN_A) as api:
        api.put_job({"job_id": "cl-slow", "schedule": LATER, "command": ["sleep", "60"]})
        eventually(lambda: _exists(api, "cl-slow"), "the job registered")
        run = api.run_now("cl-slow")
        eventually(lambda: _state(api, run.run_id) == "running", "the run started", 60)
        with pytest.raises(WaitTimeout) as waited:
            api.wait(run.run_id, timeout_s=1, poll_s=0.2)
        assert waited.value.run.state == "running"
        api.cancel(run.run_id)
        assert api.wait(run.run_id, timeout_s=60).state == "cancelled"
        api.delete("cl-slow")
        eventually(lambda: not _exists(api, "cl-slow"), "the delete")


def test_every_refusal_is_a_typed_error_with_the_apis_words(url: str) -> None:
    with Client(url, TOKEN_A) as api:
        with pytest.raises(NotFound) as missing:
            api.job("cl-ghost")
        assert missing.value.message == "job 'cl-ghost' not found"
        with pytest.raises(Invalid) as bad:
            api.put_job(
                {"job_id": "cl-bad", "schedule": {"cron": "61 * * * *"}, "command": ["true"]}
            )
        assert "minute" in bad.value.message
        assert bad.value.status == 422
        api.put_job({"job_id": "cl-theirs", "schedule": LATER, "command": ["true"]})
        eventually(lambda: _exists(api, "cl-theirs"), "the job registered")
        with pytest.raises(Conflict):
            api.create_job({"job_id": "cl-theirs", "schedule": LATER, "command": ["true"]})
    with Client(url, TOKEN_B) as other:
        with pytest.raises(NotFound):  # another owner's job is not even seen
            other.pause("cl-theirs")
        with pytest.raises(Conflict):  # nor replaced
            other.put_job({"job_id": "cl-theirs", "schedule": LATER, "command": ["false"]})
    with Client(url, "tok-nobody-0123456789") as stranger, pytest.raises(Unauthorized):
        stranger.job("cl-theirs")


def _state(api: Client, run_id: str) -> str | None:
    try:
        return api.run(run_id).state
    except NotFound:
        return None  # not projected yet


def _exists(api: Client, job_id: str) -> bool:
    try:
        api.job(job_id)
    except NotFound:
        return False
    return True


# -- the CLI over the API ---------------------------------------------------------------


def test_the_cli_over_the_api_with_a_token_and_nothing_else(url: str, tmp_path: Path) -> None:
    env = {"CRONLOG_API_URL": url, "CRONLOG_TOKEN": TOKEN_A}
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "- job_id: cl-cli\n  schedule: {every: 1h}\n  command: [echo, from-cli]\n"
        "- job_id: cl-cli-bad\n  schedule: {cron: '0 0 31 2 *'}\n  command: ['true']\n"
    )
    added = cli_with_only("jobs", "add", "-f", str(jobs), env=env)
    assert added.returncode == 1, added.stderr  # one of the two refused
    assert "cl-cli: registered" in added.stdout
    assert "cl-cli-bad: rejected" in added.stderr
    assert "never fires" in added.stderr

    with Client(url, TOKEN_A) as api:
        eventually(lambda: _exists(api, "cl-cli"), "the job registered")
    listed = cli_with_only("jobs", "list", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    owners = {j["job_id"]: j["owner"] for j in orjson.loads(listed.stdout)}
    assert owners["cl-cli"] == "team-ca"  # the token's owner, not 'default'
    assert "cl-ghost" not in owners

    missing = cli_with_only("jobs", "show", "cl-ghost", env=env)
    assert missing.returncode == 1
    assert "job 'cl-ghost' not found" in missing.stderr

    started = cli_with_only("jobs", "run-now", "cl-cli", "--request-id", "k1", "--json", env=env)
    assert started.returncode == 0, started.stderr
    run_id = orjson.loads(started.stdout)["run_id"]
    with Client(url, TOKEN_A) as api:
        assert api.wait(run_id, timeout_s=60).state == "succeeded"
    shown = cli_with_only("runs", "list", "--job", "cl-cli", env=env)
    assert run_id in shown.stdout
    assert "succeeded" in shown.stdout
    logs = cli_with_only("runs", "logs", run_id, env=env)
    assert logs.stdout == "from-cli\n"

    # Options on the command win over the environment; an API that is not there is exit 2.
    gone = cli_with_only("jobs", "--api", "http://127.0.0.1:9", "list", env=env)
    assert gone.returncode == 2
    assert "cannot be reached" in gone.stderr
    half = cli_with_only("jobs", "list", env={"CRONLOG_API_URL": url})
    assert half.returncode == 2
    assert "needs a token" in half.stderr


def test_login_keeps_a_profile_only_its_owner_reads(url: str, tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    refused = cli_with_only("login", "--api", url, "--token", "tok-wrong-0123456789", env=env)
    assert refused.returncode == 1
    assert "refused" in refused.stderr
    assert not (tmp_path / "config" / "cronlog" / "profile.json").exists()
    done = cli_with_only("login", "--api", url, "--token", TOKEN_B, env=env)
    assert done.returncode == 0, done.stderr
    profile = tmp_path / "config" / "cronlog" / "profile.json"
    assert stat.S_IMODE(profile.stat().st_mode) == 0o600
    listed = cli_with_only("jobs", "list", "--json", env=env)  # no URL or token but the profile's
    assert listed.returncode == 0, listed.stderr
    assert all(j["owner"] == "team-cb" for j in orjson.loads(listed.stdout))
    assert cli_with_only("logout", env=env).returncode == 0
    assert not profile.exists()


def test_jobs_as_code_from_a_token_to_apply_prune_in_ci(url: str, tmp_path: Path) -> None:
    """A team member's CI: apply a folder of jobs, see drift, change a job, remove one and
    prune it; a job made by hand is never pruned."""
    env = {"CRONLOG_API_URL": url, "CRONLOG_TOKEN": TOKEN_A}
    repo = tmp_path / "jobs"
    repo.mkdir()
    (repo / "etl.yaml").write_text(
        "- job_id: ac-extract\n  schedule: {every: 1h}\n  command: [echo, extract]\n"
        "- job_id: ac-load\n  command: [echo, load]\n  depends_on: [ac-extract]\n"
    )
    (repo / "report.json").write_text(
        '{"job_id": "ac-report", "schedule": {"cron": "0 6 * * *"}, "command": ["echo"]}'
    )
    with Client(url, TOKEN_A) as api:
        api.put_job({"job_id": "ac-by-hand", "schedule": LATER, "command": ["true"]})
        eventually(lambda: _exists(api, "ac-by-hand"), "the hand-made job")

        dry = cli_with_only("apply", "-f", str(repo), "--dry-run", env=env)
        assert dry.returncode == 0, dry.stderr
        assert "+ ac-extract (create)" in dry.stdout
        assert "3 to create, 0 to change, 0 unchanged, 0 to delete (dry run" in dry.stdout
        assert not _exists(api, "ac-extract")

        applied = cli_with_only("apply", "-f", str(repo), env=env)
        assert applied.returncode == 0, applied.stderr
        eventually(lambda: all(_exists(api, j) for j in ("ac-extract", "ac-load", "ac-report")),
                   "the applied jobs")  # fmt: skip
        assert api.job("ac-load").spec["managed_by"] == "cronlog-apply"
        clean = cli_with_only("diff", "-f", str(repo), env=env)
        assert clean.returncode == 0, clean.stdout + clean.stderr

        (repo / "report.json").write_text(
            '{"job_id": "ac-report", "schedule": {"cron": "0 7 * * *"}, "command": ["echo"]}'
        )
        (repo / "etl.yaml").write_text(
            "- job_id: ac-extract\n  schedule: {every: 60m}\n  command: [echo, extract]\n"
        )
        drift = cli_with_only(
            "diff", "-f", str(repo), "--prune", "--managed-by", "cronlog-apply", env=env
        )
        assert drift.returncode == 1
        assert "~ ac-report (change)" in drift.stdout
        assert '    schedule: {"cron":"0 6 * * *"' in drift.stdout
        assert "- ac-load (delete)" in drift.stdout
        assert "ac-extract" not in drift.stdout  # every 60m is every 1h: no change
        assert "ac-by-hand" not in drift.stdout

        # Another owner's token prunes nothing of this owner's.
        theirs = cli_with_only(
            "apply", "-f", str(repo / "report.json"), "--prune", "--managed-by",
            "cronlog-apply", "--dry-run", env={**env, "CRONLOG_TOKEN": TOKEN_B},
        )  # fmt: skip
        assert "- ac-" not in theirs.stdout

        pruned = cli_with_only(
            "apply", "-f", str(repo), "--prune", "--managed-by", "cronlog-apply", env=env
        )
        assert pruned.returncode == 0, pruned.stderr
        eventually(lambda: not _exists(api, "ac-load"), "the pruned job deleted")
        eventually(lambda: "0 7" in api.job("ac-report").spec["schedule"]["cron"], "the change")
        assert _exists(api, "ac-by-hand")
        assert (
            cli_with_only(
                "diff", "-f", str(repo), "--prune", "--managed-by", "cronlog-apply", env=env
            ).returncode
            == 0
        )

        exported = tmp_path / "export.yaml"
        out = cli_with_only("jobs", "export", "-o", str(exported), env=env)
        assert out.returncode == 0, out.stderr
        assert cli_with_only("diff", "-f", str(exported), env=env).returncode == 0

        broken = repo / "broken.yaml"
        broken.write_text("- job_id: ac-broken\n  schedule: {every: 1h}\n  command: []\n")
        refused = cli_with_only("apply", "-f", str(repo), env=env)
        assert refused.returncode == 1
        assert f"{broken}:1: job ac-broken: command" in refused.stderr


def test_an_admins_prune_deletes_only_the_jobs_of_the_owners_the_files_name(
    url: str, topics: Settings, tmp_path: Path
) -> None:
    """Issue 52 item 6, issue 53 item 5: files for `owner: px-team` with `jobs: []`,
    pruned with an admin token and with --direct, delete px-team's apply-managed jobs
    only: another owner's (and px-team's made by hand) stay. Files naming no owner are
    refused as admin, nothing deleted."""
    team = tmp_path / "team.yaml"
    team.write_text("owner: px-team\njobs: []\n")
    nobody = tmp_path / "nobody.yaml"
    nobody.write_text("jobs: []\n")
    job = {"schedule": LATER, "command": ["true"]}
    managed = {**job, "managed_by": "cronlog-apply"}
    kept = {"px-team-by-hand": "px-team", "px-other-a": "px-other", "px-other-b": "px-other"}
    with Client(url, TOKEN_ADMIN) as api:
        api.put_job({"job_id": "px-team-by-hand", "owner": "px-team", **job})
        api.put_job({"job_id": "px-other-a", "owner": "px-other", **managed})
        api.put_job({"job_id": "px-other-b", "owner": "px-other", **managed})

        def prune(old: str, env: dict[str, str], *args: str) -> None:
            api.put_job({"job_id": old, "owner": "px-team", **managed})
            eventually(lambda: all(_exists(api, j) for j in [old, *kept]), "the jobs")

            refused = cli_with_only(
                "apply",
                "-f",
                str(nobody),
                "--prune",
                "--managed-by",
                "cronlog-apply",
                *args,
                env=env,
            )
            assert refused.returncode == 1, refused.stdout + refused.stderr
            assert "the files name no owner" in refused.stderr
            assert "`owner: NAME` at the top of a file" in refused.stderr
            assert "(delete)" not in refused.stdout

            pruned = cli_with_only(
                "apply", "-f", str(team), "--prune", "--managed-by", "cronlog-apply", *args, env=env
            )
            assert pruned.returncode == 0, pruned.stdout + pruned.stderr
            assert "prune scope: owner px-team, managed_by 'cronlog-apply'" in pruned.stdout
            deletes = [line for line in pruned.stdout.splitlines() if line.startswith("- ")]
            assert deletes == [f"- {old} (delete)"], pruned.stdout
            eventually(lambda: not _exists(api, old), f"{old} pruned")
            assert all(_exists(api, j) for j in kept)

        prune("px-team-old-admin", {"CRONLOG_API_URL": url, "CRONLOG_TOKEN": TOKEN_ADMIN})
        prune("px-team-old-direct", env_for(topics), "--direct")
        assert {j.job_id: j.owner for j in api.jobs() if j.job_id.startswith("px-")} == kept


def test_run_parameters_from_the_request_to_the_process_and_the_history(
    url: str, topics: Settings
) -> None:
    """A job declares parameters; run-now passes values; the process gets them in
    CRONLOG_PARAMS and its argv; the run records them. Bad values: 422 from the API, the
    dead letters on the topic path, nothing run either way."""
    job = {
        "job_id": "cl-params",
        "schedule": LATER,
        "command": ["sh", "-c", 'echo "$CRONLOG_PARAMS"; echo "$1"', "sh", "day={day}"],
        "params": {"day": {"type": "string", "default": "today"}, "n": {"type": "integer"}},
        "params_in_command": True,
    }
    with Client(url, TOKEN_A) as api:
        answer = api.put_job(job)
        assert any("params.n has no default" in w for w in answer.warnings)
        eventually(lambda: _exists(api, "cl-params"), "the job registered")
        run = api.run_now("cl-params", request_id="p1", params={"n": 3, "day": "2026-12-01"})
        done = api.wait(run.run_id, timeout_s=60)
        assert done.state == "succeeded"
        assert done.params == {"day": "2026-12-01", "n": 3}
        assert api.logs(run.run_id) == '{"day":"2026-12-01","n":3}\nday=2026-12-01\n'
        with pytest.raises(Invalid) as typed:
            api.run_now("cl-params", params={"n": "three"})
        assert typed.value.field == "params.n"
        assert typed.value.message == "params.n must be an integer"
        with pytest.raises(Invalid, match="declares no such parameter"):
            api.run_now("cl-params", params={"n": 1, "user": "root"})

        letters = consumer(topics, "commands.dlq")
        try:
            bad = {"type": "job.run_now", "job_id": "cl-params", "request_id": "p-bad"}
            send_commands(topics, [{**bad, "params": {"n": True}}])
            reasons: list[str] = []

            def dead_lettered() -> bool:
                for message in letters.consume(100, timeout=0.5):
                    reasons.append(orjson.loads(message.value() or b"{}").get("reason", ""))
                return any("params.n must be an integer" in r for r in reasons)

            eventually(dead_lettered, "the bad values in commands.dlq")
        finally:
            letters.close()
        with pytest.raises(NotFound):
            api.run("cl-params@manual:p-bad")


def test_calendars_bounds_and_resume_on_the_real_services(url: str) -> None:
    """A job whose calendar excludes today: its firings are recorded skipped naming the
    calendar. Paused and resumed with `missed: last`, the newest firing the pause covered
    runs (the calendar is gone by then); `max_runs` stops the schedule."""
    from datetime import UTC, datetime, timedelta

    today = datetime.now(UTC).date()
    days = f"{today - timedelta(days=1)}..{today + timedelta(days=1)}"
    job = {
        "job_id": "cl-cal",
        "schedule": {"every": "2s"},
        "command": ["true"],
        "exclude": [{"name": "freeze", "dates": [days]}],
    }
    with Client(url, TOKEN_A) as api:
        api.put_job(job)
        eventually(lambda: _exists(api, "cl-cal"), "the job registered")
        skipped = eventually(
            lambda: [r for r in api.runs(job_id="cl-cal") if r.state == "skipped"],
            "a firing skipped by the calendar",
        )
        assert skipped[0].error == f"excluded by calendar freeze ({days})"
        assert not [r for r in api.runs(job_id="cl-cal") if r.state == "succeeded"]

        api.pause("cl-cal")
        eventually(lambda: api.job("cl-cal").paused, "the pause")
        api.put_job({**job, "exclude": None, "max_runs": 3})  # the freeze is over
        eventually(lambda: api.job("cl-cal").spec.get("max_runs") == 3, "the change")
        time.sleep(5)  # firings the pause covers: `last` runs the newest of them only
        before = {r.run_id for r in api.runs(job_id="cl-cal")}
        api.resume("cl-cal", missed="last")
        ran = eventually(
            lambda: [r for r in api.runs(job_id="cl-cal") if r.run_id not in before and r.final],
            "the missed firing run",
        )
        assert ran[0].state == "succeeded"
        # max_runs: the schedule stops after its third run (counted since registration).
        eventually(lambda: api.job("cl-cal").next_due_at is None, "the schedule done", 60)
        made = [r for r in api.runs(job_id="cl-cal") if r.state != "skipped"]
        assert len(made) == 3
