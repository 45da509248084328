"""A secret is an owner's (issue 53, item 2): the grants (streams/core/secret_grants.py),
read from CRONLOG_SECRETS_GRANTS; the ledger refusing (and dead-lettering) a spec that
names a secret its owner may not use; the worker refusing it again when it resolves the
values (connectors/worker/secrets.py), reading the grants and the values per run."""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.worker.secrets import MissingSecret, SecretNotGranted, Secrets
from schemas.codec import JOB_LOG, RUN_EVENTS
from schemas.records import JobEvent, JobUpserted
from schemas.spec import EverySchedule, JobSpec
from streams import ledger as ledger_module
from streams.core.clock import ManualClock
from streams.core.ledger import LedgerConfig, decide
from streams.core.secret_grants import GrantsError, SecretGrants, secret_env_name
from streams.kafka import producer_config
from streams.ledger import Ledger
from streams.memory import MemoryClients
from streams.memory_log import MemoryLog
from streams.settings import Settings, SettingsError

T0 = 1_800_000_000_000
GRANTS = SecretGrants.from_document(
    {"db-pass": ["payments"], "api-token": ["team-*", "ops"], "ca": "*", "none": []}
)
OWNER = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)


def spec(owner: str, secrets: dict[str, str], job_id: str = "j") -> JobSpec:
    return JobSpec(
        job_id=job_id,
        owner=owner,
        schedule=EverySchedule(60_000),
        command=("true",),
        secret_env=tuple(sorted(secrets.items())),
    )


# -- the grants --------------------------------------------------------------------------


def test_a_secret_is_usable_by_the_owners_its_grant_names_and_no_one_else() -> None:
    assert GRANTS.allows("db-pass", "payments")
    assert not GRANTS.allows("db-pass", "payments-2")  # the whole id, not a prefix
    assert not GRANTS.allows("db-pass", "Payments")  # case-sensitive
    assert GRANTS.allows("api-token", "team-a")
    assert GRANTS.allows("api-token", "ops")
    assert not GRANTS.allows("api-token", "team")
    assert GRANTS.allows("ca", "anyone")
    assert not GRANTS.allows("none", "payments")  # granted to no one, explicitly
    assert not GRANTS.allows("unlisted", "payments")  # not named: no one's
    assert not GRANTS.allows("ca", "")  # a placeholder's empty owner: no one
    assert GRANTS.usable("team-x") == ("api-token", "ca")
    assert GRANTS.refused("team-x", [("A", "api-token"), ("B", "db-pass")]) == (("B", "db-pass"),)
    assert SecretGrants().usable("payments") == ()


@given(owner=OWNER, secret=st.sampled_from(["db-pass", "api-token", "x"]))
def test_no_grants_no_secret(owner: str, secret: str) -> None:
    assert not SecretGrants().allows(secret, owner)
    assert not SecretGrants.from_document(None).allows(secret, owner)


@given(owner=OWNER, other=OWNER)
def test_a_literal_pattern_grants_exactly_that_owner(owner: str, other: str) -> None:
    grants = SecretGrants.from_document({"s": [owner]})
    assert grants.allows("s", owner)
    assert grants.allows("s", other) == (other == owner)


@given(prefix=OWNER, owner=OWNER)
def test_a_star_pattern_grants_the_owners_it_prefixes(prefix: str, owner: str) -> None:
    grants = SecretGrants.from_document({"s": [f"{prefix}-*"], "all": ["*"]})
    assert grants.allows("s", owner) == owner.startswith(f"{prefix}-")
    assert grants.allows("s", f"{prefix}-{owner}")
    assert grants.allows("all", owner)


@given(owner=OWNER)
def test_a_question_mark_is_one_character_and_a_class_one_of_its_own(owner: str) -> None:
    grants = SecretGrants.from_document({"q": ["team-?"], "c": ["team-[ab]"]})
    assert grants.allows("q", f"team-{owner}") == (len(owner) == 1)
    assert grants.allows("c", f"team-{owner}") == (owner in ("a", "b"))


@pytest.mark.parametrize(
    ("doc", "said"),
    [
        (["db-pass"], "must map secret names"),
        ({"../etc/passwd": ["x"]}, "is not a secret name"),
        ({"": ["x"]}, "is not a secret name"),
        ({7: ["x"]}, "is not a secret name"),
        ({"s": None}, "give a list of owner patterns"),
        ({"s": {"owner": "x"}}, "give a list of owner patterns"),
        ({"s": ["team a"]}, "is not an owner pattern"),
        ({"s": [""]}, "is not an owner pattern"),
        ({"s": [3]}, "is not an owner pattern"),
        ({123: ["x"]}, r"YAML read 123, not text: quote it"),
        ({"s": [True]}, r"YAML read True, not text: quote it"),
    ],
)
def test_a_bad_grants_document_is_refused_saying_what(doc: object, said: str) -> None:
    with pytest.raises(GrantsError, match=said):
        SecretGrants.from_document(doc)


@pytest.mark.parametrize("other", ["DB.PASS", "db_pass", "DB-pass", "db.pass"])
def test_two_secret_names_sharing_an_environment_variable_are_refused(other: str) -> None:
    """`db-pass` and `DB.PASS` are both CRONLOG_SECRET_DB_PASS on the worker: an owner
    granted one would read the other's value, so the grants refuse the pair, naming
    both and the variable."""
    assert secret_env_name(other) == secret_env_name("db-pass") == "CRONLOG_SECRET_DB_PASS"
    with pytest.raises(GrantsError) as raised:
        SecretGrants.from_document({"db-pass": ["payments"], other: ["noisy"]})
    said = str(raised.value)
    assert "'db-pass'" in said
    assert repr(other) in said
    assert "CRONLOG_SECRET_DB_PASS" in said
    # Names that differ after the mapping are fine.
    assert SecretGrants.from_document({"db-pass": ["payments"], "db-pass2": ["noisy"]})


def test_settings_read_the_grants_file_and_a_bad_one_stops_the_start(tmp_path: Path) -> None:
    good = tmp_path / "grants.yaml"
    good.write_text("# who may use what\ndb-pass: [payments]\napi-token: team-*\n")
    settings = Settings.from_env({"CRONLOG_SECRETS_GRANTS": str(good)})
    assert settings.secret_grants.grants == (("api-token", ("team-*",)), ("db-pass", ("payments",)))
    assert Settings.from_env({}).secret_grants == SecretGrants()  # unset: nothing granted
    bad = tmp_path / "bad.yaml"
    for text, said in (
        ("db-pass: [payments\n", "not YAML"),
        ("- db-pass\n", "must map secret names"),
        ("db-pass: [pay ments]\n", "is not an owner pattern"),
    ):
        bad.write_text(text)
        with pytest.raises(SettingsError, match=said) as raised:
            Settings.from_env({"CRONLOG_SECRETS_GRANTS": str(bad)})
        assert "CRONLOG_SECRETS_GRANTS" in str(raised.value)
        assert str(bad) in str(raised.value)
    with pytest.raises(SettingsError, match="cannot read"):
        Settings.from_env({"CRONLOG_SECRETS_GRANTS": str(tmp_path / "missing.yaml")})


# -- the ledger --------------------------------------------------------------------------


def test_the_ledger_refuses_and_dead_letters_a_spec_naming_a_secret_not_granted() -> None:
    config = LedgerConfig(secret_grants=GRANTS)
    theft = decide(None, lambda _: None, JobUpserted(spec("team-b", {"X": "db-pass"}), T0), config)
    assert theft.dead_letter
    assert theft.job is None
    assert not theft.events
    assert "secret 'db-pass'" in theft.rejected
    assert "'team-b'" in theft.rejected
    assert "env.X" in theft.rejected
    # Its own secrets are fine, and a spec naming none needs no grant.
    ok = decide(None, lambda _: None, JobUpserted(spec("team-b", {"X": "api-token"}), T0), config)
    assert ok.job is not None
    assert not ok.rejected
    # The default grants nothing: a node without a grants file refuses every secret.
    default = decide(None, lambda _: None, JobUpserted(spec("payments", {"X": "db-pass"}), T0))
    assert default.dead_letter
    assert "secret 'db-pass'" in default.rejected
    plain = decide(None, lambda _: None, JobUpserted(spec("payments", {}), T0))
    assert plain.job is not None


def test_a_change_adding_a_secret_not_granted_leaves_the_job_as_it_was() -> None:
    config = LedgerConfig(secret_grants=GRANTS)
    first = decide(None, lambda _: None, JobUpserted(spec("ops", {"A": "api-token"}), T0), config)
    assert first.job is not None
    change = JobUpserted(spec("ops", {"A": "api-token", "B": "db-pass"}), T0 + 1)
    refused = decide(first.job, lambda _: None, change, config)
    assert refused.dead_letter
    assert refused.job is None
    assert "secret 'db-pass'" in refused.rejected


def test_the_ledger_process_dead_letters_the_spec_naming_the_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ledger loop over the in-memory Kafka: the refused upsert goes to commands.dlq
    with the secret's name as the reason, and is never registered."""
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)
    monkeypatch.setattr(ledger_module, "OFFSETS_WATCHDOG_S", 600.0)
    settings = Settings(partitions=2, topic_prefix="grants.")
    clock = ManualClock()
    log = MemoryLog(clock)
    log.create_catalogue(settings)
    clients = MemoryClients(log)
    config = LedgerConfig(secret_grants=GRANTS)
    ledger = Ledger(settings, config, node_id="L", clients=clients, clock=clock)
    assert ledger.open()
    producer = clients.producer(producer_config(settings))
    now = int(clock.time() * 1000)
    for job in (
        spec("team-b", {"X": "db-pass"}, "steal"),
        spec("payments", {"X": "db-pass"}, "own"),
    ):
        upsert = JobUpserted(job, now)
        producer.produce(
            settings.topic("job-log"), key=job.job_id.encode(), value=JOB_LOG.encode(upsert)
        )
    for _ in range(50):
        ledger.step()
        clock.advance(0.1)
    dead = [m.value() or b"" for m in log.records(settings.topic("commands.dlq"))]
    assert len(dead) == 1
    assert b"secret 'db-pass'" in dead[0]
    assert b"team-b" in dead[0]
    events = [
        RUN_EVENTS.decode(m.value() or b"") for m in log.records(settings.topic("run-events"))
    ]
    assert {e.job_id for e in events if isinstance(e, JobEvent)} == {"own"}


# -- the worker --------------------------------------------------------------------------


def test_the_worker_refuses_a_secret_of_another_owner_naming_it_never_its_value(
    tmp_path: Path,
) -> None:
    (tmp_path / "db-pass").write_text("hunter2\n")
    secrets = Secrets(tmp_path, {}, grants=GRANTS)
    assert secrets.resolve((("DB", "db-pass"),), "payments") == {"DB": "hunter2"}
    with pytest.raises(SecretNotGranted) as raised:
        secrets.resolve((("DB", "db-pass"),), "team-b")
    assert isinstance(raised.value, MissingSecret)  # the worker fails the attempt with it
    assert "secret 'db-pass'" in str(raised.value)
    assert "'team-b'" in str(raised.value)
    assert "hunter2" not in str(raised.value)
    # Unset, no grants: no one may use a secret the worker holds.
    with pytest.raises(SecretNotGranted):
        Secrets(tmp_path, {}).resolve((("DB", "db-pass"),), "payments")
    assert Secrets(tmp_path, {}).resolve((), "payments") == {}


def test_the_worker_never_serves_a_variable_another_granted_name_shares() -> None:
    """Defence in depth, for grants built without `from_document`'s check: owner noisy,
    granted `DB.PASS`, never reads payments' `db-pass` from CRONLOG_SECRET_DB_PASS, and
    neither does payments while the grants hold both names."""
    both = SecretGrants((("DB.PASS", ("noisy",)), ("db-pass", ("payments",))))
    assert both.sharing_env("DB.PASS") == ("db-pass",)
    secrets = Secrets(None, {"CRONLOG_SECRET_DB_PASS": "hunter2"}, grants=both)
    for owner, name in (("noisy", "DB.PASS"), ("payments", "db-pass")):
        with pytest.raises(MissingSecret, match="CRONLOG_SECRET_DB_PASS") as raised:
            secrets.resolve((("DB", name),), owner)
        assert "hunter2" not in str(raised.value)
    # One name per variable: served.
    alone = Secrets(None, {"CRONLOG_SECRET_DB_PASS": "hunter2"}, grants=GRANTS)
    assert alone.resolve((("DB", "db-pass"),), "payments") == {"DB": "hunter2"}


def _replace(path: Path, text: str) -> None:
    """As an operator rotates a file: a new one renamed over the old."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


def test_rotation_values_and_grants_are_read_per_run(tmp_path: Path) -> None:
    """A value replaced is what the next run gets; a grant revoked in the file refuses
    the next run; a grants file that became invalid fails closed, naming the problem."""
    values, grants = tmp_path / "secrets", tmp_path / "grants.yaml"
    values.mkdir()
    _replace(values / "db-pass", "v1\n")
    _replace(grants, "db-pass: [payments]\n")
    secrets = Secrets(values, {"CRONLOG_SECRETS_GRANTS": str(grants)})
    refs = (("DB", "db-pass"),)
    assert secrets.resolve(refs, "payments") == {"DB": "v1"}
    _replace(values / "db-pass", "v2\n")
    assert secrets.resolve(refs, "payments") == {"DB": "v2"}
    _replace(grants, "db-pass: [team-*]\n")  # revoked from payments, granted to teams
    with pytest.raises(SecretNotGranted, match="'payments'"):
        secrets.resolve(refs, "payments")
    assert secrets.resolve(refs, "team-a") == {"DB": "v2"}
    _replace(grants, "db-pass: [team a]\n")
    with pytest.raises(SecretNotGranted, match="grants are unreadable") as raised:
        secrets.resolve(refs, "team-a")
    assert "v2" not in str(raised.value)
    grants.unlink()
    with pytest.raises(SecretNotGranted, match="cannot read"):
        secrets.resolve(refs, "team-a")
    _replace(grants, "db-pass: [team-*]\n")
    assert secrets.resolve(refs, "team-a") == {"DB": "v2"}


@given(
    owner=OWNER,
    name=st.text(string.ascii_letters + string.digits + "-", min_size=1, max_size=12),
)
def test_an_unlisted_secret_is_never_resolved_whoever_asks(owner: str, name: str) -> None:
    secrets = Secrets(None, {f"CRONLOG_SECRET_{name.upper()}": "v"}, grants=SecretGrants())
    with pytest.raises(SecretNotGranted):
        secrets.resolve((("X", name),), owner)
