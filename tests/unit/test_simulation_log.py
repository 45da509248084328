"""The seeded simulation again, with the real ledger process in the loop (pure, no broker).

test_simulation.py decides every input with the ledger's rules on a dict World. Here the
same actors (test_simulation.Sim: schedulers, a zombie proposer, workers, an operator, a
hostile network) write their inputs to job-log on an in-memory Kafka (streams/memory.py),
and `streams.ledger.Ledger` itself - its consumer group, transactions, state writes and
takeovers - decides them; everything the actors see (jobs, runs, run-events, dispatch
requests, claim replies) is read back from the committed topics. Between steps the
nodes fail as real ones do:
 - kill -9 of a ledger node at a random client call (mid-transaction, at the offsets, at
   the commit, or idle); its open transaction and its group membership stay behind until
   the broker's timeouts end them, and a new node starts, under the same node id (its
   `init_transactions` fences the dead one at once) or a new one;
 - a zombie: another node joins the group while a node is about to send its offsets, so
   the group's generation moves on under it and its transaction must abort;
 - a node joins or leaves cleanly (a rebalance).
The checks are test_simulation's (no two runs for one firing, every firing decided, one
claim per attempt, legal transitions, every run final), on what the topics hold.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from schemas.codec import DISPATCH, JOB_LOG, JOB_STATE, RUN_EVENTS, RUN_STATE, WORKER_INBOX
from schemas.records import (
    CancelOrder,
    ClaimReply,
    ClaimRequested,
    DispatchRequest,
    JobEvent,
    JobState,
    LedgerInput,
    RunEvent,
    RunFinished,
    RunReleased,
    RunStarted,
    RunState,
    UpstreamFinished,
)
from schemas.spec import EverySchedule, JobSpec, Param, Resources
from streams import ledger as ledger_module
from streams.core.clock import ManualClock
from streams.core.ledger import input_job
from streams.core.seals import KEY_BYTES, seal
from streams.identity import NodeIdTaken, parse_client_id
from streams.kafka import consumer_config, producer_config
from streams.ledger import Ledger
from streams.memory import MemoryClients
from streams.memory_log import MemoryLog
from streams.settings import Settings
from tests.support.world import World
from tests.unit.test_simulation import (
    CONFIG,
    T0,
    Sim,
    _param_fault,
    audited,
    check,
    check_rules,
    replace_pause,
)

SEEDS = int(os.environ.get("CRONLOG_LOG_SIM_SEEDS", "12"))
STEPS = int(os.environ.get("CRONLOG_LOG_SIM_STEPS", "700"))
SETTINGS = Settings(partitions=4, topic_prefix="sim.")
KEY = bytes(range(KEY_BYTES))
LEDGER_CONFIG = replace(CONFIG, placement_key=KEY)
GROUP = SETTINGS.group("ledger")
SEALED = (ClaimRequested, RunStarted, RunFinished, RunReleased)


class Killed(BaseException):
    """kill -9: raised from a client call, it unwinds the node's loop (no handler in the
    ledger catches a BaseException) and the node is never touched again."""


class LogWorld:
    """What the actors see: the committed topics, read as they grow."""

    def __init__(self, log: MemoryLog, settle: Callable[[], None]):
        self.settle = settle
        self.outbox: list[LedgerInput] = []  # notices travel through job-log itself
        self._jobs: dict[str, JobState] = {}
        self._runs: dict[str, RunState] = {}
        self._events: list[RunEvent | JobEvent] = []
        self._dispatch: list[DispatchRequest] = []
        self._replies: list[ClaimReply | CancelOrder] = []
        self.reader = MemoryClients(log).consumer(consumer_config(SETTINGS, None))
        self.reader.assign(
            [
                tp
                for name in ("jobs", "runs", "run-events", "dispatch", "worker-inbox")
                for tp in _partitions(log, SETTINGS.topic(name))
            ]
        )

    def _read(self) -> None:
        self.settle()
        topic = {SETTINGS.topic(n): n for n in ("jobs", "runs", "run-events", "dispatch")}
        while messages := self.reader.consume(100_000, timeout=0):
            for msg in messages:
                name = topic.get(msg.topic() or "", "worker-inbox")
                key, value = (msg.key() or b"").decode(), msg.value()
                if name == "jobs" and value is not None:
                    self._jobs[key] = JOB_STATE.decode(value)
                elif name == "runs":
                    if value is None:
                        self._runs.pop(key, None)
                    else:
                        self._runs[key] = RUN_STATE.decode(value)
                elif name == "run-events" and value is not None:
                    self._events.append(RUN_EVENTS.decode(value))
                elif name == "dispatch" and value is not None:
                    self._dispatch.append(DISPATCH.decode(value))
                elif value is not None:
                    reply = WORKER_INBOX.decode(value)
                    if isinstance(reply, ClaimReply | CancelOrder):
                        self._replies.append(reply)

    @property
    def jobs(self) -> dict[str, JobState]:
        self._read()
        return self._jobs

    @property
    def runs(self) -> dict[str, RunState]:
        self._read()
        return self._runs

    @property
    def events(self) -> list[RunEvent | JobEvent]:
        self._read()
        return self._events

    @property
    def dispatch(self) -> list[DispatchRequest]:
        self._read()
        return self._dispatch

    @property
    def replies(self) -> list[ClaimReply | CancelOrder]:
        self._read()
        return self._replies

    def run_events(self, run_id: str | None = None) -> list[RunEvent]:
        return [
            e
            for e in self.events
            if isinstance(e, RunEvent) and (run_id is None or e.run_id == run_id)
        ]

    @property
    def dispatch_specs(self) -> list[tuple[JobSpec, ...]]:
        """The specs that may have been in force at each dispatch request, as
        `World.dispatch_specs` (the newest registered at or before the request's time,
        and the one before it, which the change's own decision decided under), read
        from the job events: the topics carry no link from a request to its decision.
        The one before is the newest spec registered *before the newest's time*, and
        every spec registered at that time is one too: an upsert delivered twice (the
        network's duplicate) registers its spec twice, and two changes sent in one
        step share their stamp (so their time), and a request decided in the first
        one's own decision, or before it, at that time, was decided under the spec
        before them all (loop seeds 165, 950025)."""
        specs: dict[str, list[tuple[int, JobSpec]]] = {}
        for e in self.events:
            if isinstance(e, JobEvent) and e.kind == "upserted" and e.spec is not None:
                specs.setdefault(e.job_id, []).append((e.at_ms, e.spec))
        out: list[tuple[JobSpec, ...]] = []
        for request in self.dispatch:
            known = [
                (at, spec) for at, spec in specs.get(request.job_id, []) if at <= request.at_ms
            ]
            last = known[-1][0] if known else None
            tied = [spec for at, spec in reversed(known) if at == last]
            before = [spec for at, spec in known if last is not None and at < last][-1:]
            candidates: list[JobSpec] = []
            for spec in (*tied, *before):
                if spec not in candidates:
                    candidates.append(spec)
            out.append(tuple(candidates))
        return out

    def snapshot(self) -> World:
        """A frozen view (for the zombie proposer)."""
        return World(CONFIG, dict(self.jobs), dict(self.runs))


def _partitions(log: MemoryLog, topic: str) -> list[TopicPartition]:
    return [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(len(log.topics[topic]))]


class LogSim(Sim):
    def __init__(self, seed: int):
        super().__init__(seed)
        self.clock = ManualClock(wall_s=T0 / 1000)
        self.kafka = MemoryLog(self.clock)
        self.kafka.create_catalogue(SETTINGS)
        self.clients = MemoryClients(self.kafka)
        self.producer = self.clients.producer(producer_config(SETTINGS))
        self.nodes: list[Ledger] = []
        self.names = 0
        self.faults = {
            "killed": 0,
            "errors": 0,
            "zombies": 0,
            "joined": 0,
            "left": 0,
            "recoveries": 0,
            "replaced": 0,
            "stopped": 0,
        }
        self.world: Any = LogWorld(self.kafka, self.settle)  # the World's view, from the topics
        self.pending: list[str] = []  # node ids to restart once their dead one left
        # The nodes inside a `step`, innermost last: a zombie frozen at its offsets while
        # a nested `settle` lets the others go on. A process is one thread: a nested
        # settle (another zombie frozen inside it) must never step one of them again.
        self.stepping: list[Ledger] = []
        self.zombies: set[Ledger] = set()  # the nodes armed to freeze at their next offsets
        self.start_node()

    def upstream_successes(self) -> dict[tuple[str, str, int], int]:
        """The ledger writes upstream notices to job-log itself: read from there, with
        their append times (the committed ones: what a ledger read)."""
        out: dict[tuple[str, str, int], int] = {}
        for msg in self.kafka.records(SETTINGS.topic("job-log")):
            inp = JOB_LOG.decode(msg.value() or b"")
            if isinstance(inp, UpstreamFinished) and inp.succeeded:
                key = (inp.job_id, inp.upstream, inp.scheduled_ms)
                out[key] = min(out.get(key, msg.timestamp()[1]), msg.timestamp()[1])
        return out

    # -- nodes --------------------------------------------------------------------------
    def start_node(self, node_id: str | None = None) -> Ledger:
        if node_id is None:
            self.names += 1
            node_id = f"node-{self.names}"
        node = Ledger(
            SETTINGS, LEDGER_CONFIG, node_id=node_id, clients=self.clients, clock=self.clock
        )
        assert node.open()
        self.nodes.append(node)
        return node

    def restart_pending(self) -> None:
        """Start the nodes waiting to restart under their id whose dead predecessor has
        left the group (its session lapsed): a live member holds the id till then."""
        with self.kafka.lock:
            self.kafka.expire()
            group = self.kafka.groups.get(GROUP)
            held = {
                parsed[1]
                for m in (group.members.values() if group else ())
                if (parsed := parse_client_id(m.consumer.client_id)) is not None
            }
        for node_id in [n for n in self.pending if n not in held]:
            self.pending.remove(node_id)
            self.start_node(node_id)

    def kill(self, node: Ledger) -> None:
        self.nodes.remove(node)
        self.faults["killed"] += 1
        self.faults["recoveries"] += node.stats().recoveries

    def arm_kill(self, node: Ledger) -> None:
        """kill -9 of `node` at its n-th client call from now."""
        calls = self.rng.randint(1, 40)

        def fault(call: str, client: object) -> None:
            nonlocal calls
            if node not in self.nodes or client not in (node.producer, node.consumer):
                return
            calls -= 1
            if calls == 0:
                self.kafka.faults.remove(fault)
                raise Killed(f"{node.node_id} at {call}")

        self.kafka.faults.append(fault)

    def arm_error(self, node: Ledger) -> None:
        """A broker error at one of `node`'s next transactional calls: the ledger aborts,
        takes its partitions over again from the committed state and redoes the batch."""
        calls = self.rng.randint(1, 30)
        kinds = ("produce", "send_offsets_to_transaction", "commit_transaction")

        def fault(call: str, client: object) -> None:
            nonlocal calls
            if node not in self.nodes or client is not node.producer or call not in kinds:
                return
            calls -= 1
            if calls == 0:
                self.kafka.faults.remove(fault)
                self.faults["errors"] += 1
                raise KafkaException(KafkaError(KafkaError._TRANSPORT, f"injected at {call}"))

        self.kafka.faults.append(fault)

    def arm_zombie(self, node: Ledger, roll: float | None = None) -> None:
        """At `node`'s next offsets, the group moves on under it: a new member joins, and
        now and then the others take its partitions over while it stands frozen there
        (its session lapses, its open transaction times out), then it goes on; or, frozen
        past its session, it is replaced by a restart under its own node id, and when it
        goes on it is fenced and stops (streams/identity.py) instead of fencing back.
        `roll` picks the case (below 0.25: replaced; below 0.6: taken over; else only a
        new member), drawn from the seed unless given. While it stands frozen, another
        zombie may freeze in the nested `settle`: both stay frozen (`stepping`). A node
        armed already is left as it is: one call freezes once (a second freeze at the
        same call, after its replacement started, would wait for ever for that live
        replacement to leave)."""
        if node in self.zombies:
            return
        self.zombies.add(node)

        def fault(call: str, client: object) -> None:
            if call != "send_offsets_to_transaction" or client is not node.producer:
                return
            self.kafka.faults.remove(fault)
            self.zombies.discard(node)
            self.faults["zombies"] += 1
            chance = self.rng.random() if roll is None else roll
            if chance < 0.25:
                self.faults["replaced"] += 1
                self.pending.append(node.node_id)  # restarted once its session lapsed
                self.settle()  # `node` is inside its step: frozen there
                return
            self.start_node()  # a new generation, which the zombie's offsets do not carry
            if chance < 0.6:
                self.settle()

        self.kafka.faults.append(fault)

    def settle(self) -> None:
        """Step the live nodes (but the frozen ones, inside a step: `stepping`) until the
        group has decided every input it can see and no transaction is open. A dead
        node's open transaction holds every read_committed reader of the partitions it
        wrote at its first record until the broker aborts it (a newer one of the same
        partition waits behind it), so only then do the topics read as one cut: the
        actors see the runs and their events together, as the simulation's workers
        assume."""
        for _ in range(5_000):
            self.restart_pending()
            if (
                not self.kafka.lag(GROUP, SETTINGS.topic("job-log"))
                and self._steady()
                and not self.kafka.open
                and not self.pending
            ):
                break
            if not self._live():
                self.clock.advance(0.5)  # only a restart waiting for a session to lapse
            for node in self._live():
                if node not in self.nodes or node in self.stepping:  # a nested settle's
                    continue  # doing: killed, stopped or frozen meanwhile
                self.stepping.append(node)
                try:
                    node.step()
                except NodeIdTaken:  # replaced under its id while frozen: it stops
                    if node in self.nodes:  # (a nested settle may have let it go)
                        self.nodes.remove(node)
                    self.faults["stopped"] += 1
                except Killed:
                    self.kill(node)
                    # A node starts in its place: a new one (the broker's timeouts end the
                    # dead one's transaction), or under its id once the dead one's session
                    # lapsed (streams/identity.py), fencing its transaction at once; none
                    # if it was a frozen zombie killed once woken, replaced under its id
                    # already (that live replacement would hold the id for ever).
                    as_itself = self.rng.random() < 0.5
                    if self._replaced(node):
                        pass
                    elif as_itself:
                        self.pending.append(node.node_id)
                    else:
                        self.start_node()
                finally:
                    self.stepping.remove(node)
        else:
            raise AssertionError(f"the ledger did not catch up: {self.faults}")
        self.now = max(self.now, int(self.clock.time() * 1000))

    def _replaced(self, node: Ledger) -> bool:
        """Whether another node runs, or is to start, under `node`'s id."""
        return node.node_id in self.pending or any(
            n.node_id == node.node_id for n in self.nodes if n is not node
        )

    def _live(self) -> list[Ledger]:
        """The nodes a settle steps: every live one but those frozen inside a step."""
        return [n for n in self.nodes if n not in self.stepping]

    def _steady(self) -> bool:
        """Every live node (but the frozen ones) has taken its share of the newest
        generation."""
        group = self.kafka.groups[GROUP]
        return all(
            (m := group.members.get(node.consumer.memberid() or "")) is not None
            and m.generation == group.generation
            for node in self._live()
        )

    # -- the actors' writes -------------------------------------------------------------
    def send(self, inp: LedgerInput) -> None:
        if isinstance(inp, SEALED):  # the seal the dispatcher gave this worker
            inp = replace(inp, placement=seal(KEY, inp.run_id, inp.attempt, inp.worker_id))
        super().send(inp)

    def deliver_now(self, inp: LedgerInput) -> None:
        behind = self.now / 1000 - self.clock.time()
        if behind > 0:
            self.clock.advance(behind)
        self.producer.produce(
            SETTINGS.topic("job-log"), key=input_job(inp).encode(), value=JOB_LOG.encode(inp)
        )

    def step(self, calm: bool = False) -> None:
        roll = self.rng.random()
        if not calm and roll < 0.01:
            self.arm_kill(self.rng.choice(self.nodes))
        elif not calm and roll < 0.02:
            self.arm_error(self.rng.choice(self.nodes))
        elif not calm and roll < 0.025 and len(self.nodes) < 4:
            self.arm_zombie(self.rng.choice(self.nodes))
        elif not calm and roll < 0.03 and len(self.nodes) < 3:
            self.faults["joined"] += 1
            self.start_node()
        elif not calm and roll < 0.035 and len(self.nodes) > 1:
            self.faults["left"] += 1
            node = self.rng.choice(self.nodes)
            self.nodes.remove(node)
            node.close()
        super().step(calm=calm)

    def crash_and_replay(self) -> None:
        """Crashes here are real (see `step`); nothing to replay by hand."""


def simulate(seed: int, steps: int) -> LogSim:
    sim = LogSim(seed)
    sim.register_jobs()
    for _ in range(steps):
        sim.step()
    sim.kafka.faults.clear()  # calm down: no more faults armed
    for key in [k for k in sim.ordered if k is not None and k[0] == "op"]:
        for inp in sim.ordered.pop(key):
            sim.deliver_now(inp)
    for job_id in list(sim.world.jobs):
        sim.deliver_now(replace_pause(job_id, sim.now))
    for _ in range(400):
        sim.step(calm=True)
    return sim


@pytest.mark.parametrize("seed", range(SEEDS))
def test_simulation_through_the_ledger_process(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # The watchdog of transactional calls waits on real time, not the simulation's: a
    # zombie stands frozen inside one while the others take over, which may take a
    # while on a loaded machine, and must not be mistaken for a hung call.
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)
    monkeypatch.setattr(ledger_module, "OFFSETS_WATCHDOG_S", 600.0)
    sim = simulate(seed, STEPS)
    check(sim)
    check_rules(sim)
    audited(sim)
    assert sim.world.run_events(), "the simulation produced no runs"


def test_the_faults_are_played(monkeypatch: pytest.MonkeyPatch) -> None:
    """The actors above really happen across a few seeds: kills, injected errors, zombies,
    and frozen ledgers replaced under their node id that stop when they go on."""
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)
    monkeypatch.setattr(ledger_module, "OFFSETS_WATCHDOG_S", 600.0)
    total: dict[str, int] = {}
    for seed in range(3):
        sim = simulate(seed, STEPS)
        for kind, n in sim.faults.items():
            total[kind] = total.get(kind, 0) + n
    assert all(total[k] > 0 for k in ("killed", "errors", "zombies", "replaced")), total
    assert total["stopped"] == total["replaced"], total  # none fenced its replacement back


def test_two_zombies_frozen_at_once_both_stay_frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """A zombie frozen at its offsets while the others go on (a nested `settle`), and one
    of those freezing in turn: the first must stay frozen in the second's settle. A
    process is one thread: stepping the first again, inside its own offsets call, began
    a second transaction on it ("a transaction is already in progress"), aborted the
    frozen one under it, and kept its member alive, so its replacement never started and
    the group never caught up (loop seed 30)."""
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)
    monkeypatch.setattr(ledger_module, "OFFSETS_WATCHDOG_S", 600.0)
    sim = LogSim(0)
    first, second = sim.nodes[0], sim.start_node()
    sim.settle()  # two partitions each
    step = Ledger.step

    def one_at_a_time(node: Ledger) -> None:
        assert node not in stepped, f"{node.node_id} stepped inside its own step"
        stepped.append(node)
        try:
            step(node)
        finally:
            stepped.remove(node)

    stepped: list[Ledger] = []
    monkeypatch.setattr(Ledger, "step", one_at_a_time)
    sim.arm_zombie(first, roll=0.0)  # both frozen past their session, then replaced
    sim.arm_zombie(second, roll=0.0)
    _one_input_each(sim)
    sim.settle()
    assert sim.faults["zombies"] == sim.faults["replaced"] == 2, sim.faults
    assert sim.faults["stopped"] == 2, sim.faults  # each woke fenced by its replacement
    assert not {first, second} & set(sim.nodes)  # their replacements under their ids
    assert sorted(n.node_id for n in sim.nodes) == sorted([first.node_id, second.node_id])
    assert not sim.kafka.lag(GROUP, SETTINGS.topic("job-log"))
    assert len(sim.kafka.records(SETTINGS.topic("commands.dlq"))) == SETTINGS.partitions


def _one_input_each(sim: LogSim) -> None:
    """An input on every job-log partition (undecodable: each goes to the DLQ), so every
    node has a transaction to send offsets for."""
    for p in range(SETTINGS.partitions):
        sim.producer.produce(SETTINGS.topic("job-log"), b"not an input", b"k", partition=p)


def test_a_node_armed_twice_as_a_zombie_freezes_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two zombies armed on one node before its next offsets: one freeze. Both fired at
    that call, and the second, after the first's replacement had started under the
    node's id, waited for ever for that live replacement to leave (loop seed 310)."""
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)
    monkeypatch.setattr(ledger_module, "OFFSETS_WATCHDOG_S", 600.0)
    sim = LogSim(0)
    node = sim.nodes[0]
    sim.settle()
    sim.arm_zombie(node, roll=0.0)  # frozen past its session, then replaced
    sim.arm_zombie(node, roll=0.0)
    _one_input_each(sim)
    sim.settle()
    assert sim.faults["zombies"] == sim.faults["replaced"] == sim.faults["stopped"] == 1
    assert [n.node_id for n in sim.nodes] == [node.node_id]
    assert sim.nodes != [node]


def test_a_zombie_killed_once_woken_after_its_replacement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A zombie replaced under its id while frozen, killed -9 as it wakes: its
    replacement is its restart. Restarting it under its id again waited for ever for
    that live replacement to leave."""
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)
    monkeypatch.setattr(ledger_module, "OFFSETS_WATCHDOG_S", 600.0)
    sim = LogSim(0)
    node = sim.nodes[0]
    sim.settle()
    sim.arm_zombie(node, roll=0.0)  # frozen past its session, then replaced

    def kill(call: str, client: object) -> None:  # then killed, at the same call
        if call == "send_offsets_to_transaction" and client is node.producer:
            sim.kafka.faults.remove(kill)
            raise Killed(f"{node.node_id} at {call}")

    sim.kafka.faults.append(kill)
    monkeypatch.setattr(sim.rng, "random", lambda: 0.0)  # a kill restarts under the id
    _one_input_each(sim)
    sim.settle()
    assert sim.faults["replaced"] == sim.faults["killed"] == 1, sim.faults
    assert [n.node_id for n in sim.nodes] == [node.node_id]
    assert sim.nodes != [node]
    assert not sim.pending


def test_the_spec_before_a_duplicated_upsert_is_the_one_before_both() -> None:
    """A change delivered twice registers its spec twice; the firings its first decision
    made due were decided under the spec before both, which a dispatch may carry (loop
    seed 165: a request without the parameters the duplicated change added)."""
    log = MemoryLog(ManualClock(wall_s=T0 / 1000))
    log.create_catalogue(SETTINGS)
    producer = MemoryClients(log).producer(producer_config(SETTINGS))
    old = JobSpec(job_id="j", owner="o", schedule=EverySchedule(1000), command=("true",))
    new = replace(old, params=(Param("day", "string"),), params_in_command=True)
    for i, (at, spec) in enumerate([(T0, old), (T0 + 500, new), (T0 + 500, new)]):
        event = JobEvent(f"j#{i}", "j", "upserted", at, spec)
        producer.produce(SETTINGS.topic("run-events"), RUN_EVENTS.encode(event), b"j")
    request = DispatchRequest(
        "j@1", "j", 1, "o", ("true",), (), Resources(), 1.0, 0, T0 + 400, T0 + 600, T0 + 600
    )
    producer.produce(SETTINGS.topic("dispatch"), DISPATCH.encode(request), b"j@1")
    assert LogWorld(log, lambda: None).dispatch_specs == [(new, old)]


def test_the_spec_before_changes_sharing_a_stamp_is_the_one_before_them_all() -> None:
    """Two changes sent in one step share their stamp, each maybe delivered twice; a
    firing made due in the first one's own decision, at that time, was decided under the
    spec before both, which the request carries (loop seed 950025: `{n}` left in the argv
    of a request decided before `params_in_command` was switched on, and a second change
    at the same time hid that spec)."""
    log = MemoryLog(ManualClock(wall_s=T0 / 1000))
    log.create_catalogue(SETTINGS)
    producer = MemoryClients(log).producer(producer_config(SETTINGS))
    old = JobSpec(
        job_id="j",
        owner="o",
        schedule=EverySchedule(1000),
        command=("run", "--n={n}"),
        params=(Param("n", "integer", "3"),),
    )
    substituted = replace(old, params_in_command=True)
    gated = replace(substituted, depends_on=("up",))
    changes = [(T0, old), *[(T0 + 500, substituted)] * 2, *[(T0 + 500, gated)] * 2]
    for i, (at, spec) in enumerate(changes):
        event = JobEvent(f"j#{i}", "j", "upserted", at, spec)
        producer.produce(SETTINGS.topic("run-events"), RUN_EVENTS.encode(event), b"j")
    env = (("CRONLOG_PARAMS", '{"n":3}'),)
    request = DispatchRequest(
        "j@1", "j", 1, "o", old.command, env, Resources(), 1.0, 0, T0 + 400, T0 + 600, T0 + 500
    )
    producer.produce(SETTINGS.topic("dispatch"), DISPATCH.encode(request), b"j@1")
    specs = LogWorld(log, lambda: None).dispatch_specs
    assert specs == [(gated, substituted, old)]
    assert not all(_param_fault(request, spec) for spec in specs[0])
