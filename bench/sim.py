"""The seeded simulations at volume, on every core: `make sim`, or
`python -m bench.sim --seeds 20000 --loop-seeds 500 --start K`.

Runs seeds K..K+N-1 of the pure simulation (tests/unit/test_simulation.py: every check
of its test, `check`, `check_rules` and the audit) and K..K+M-1 of the simulation
through the ledger process on the in-memory Kafka (tests/unit/test_simulation_log.py),
in a pool of processes, and prints seeds per second, every failing seed with its first
line, and the total time. Exits 1 when a seed failed. Defaults from the environment:
CRONLOG_SIM_SEEDS (2000), CRONLOG_LOG_SIM_SEEDS (50).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
import traceback


def _pure(seed: int) -> tuple[str, int, str]:
    from tests.unit.test_simulation import STEPS, audited, check, check_rules, simulate

    try:
        sim = simulate(seed, STEPS)
        check(sim)
        check_rules(sim)
        audited(sim)
        assert sim.world.run_events(), "the simulation produced no runs"
    except Exception as exc:  # noqa: BLE001 - report, never stop the pool
        return "pure", seed, _first_line(exc)
    return "pure", seed, ""


def _loop(seed: int) -> tuple[str, int, str]:
    from streams import ledger as ledger_module
    from tests.unit.test_simulation import audited, check, check_rules
    from tests.unit.test_simulation_log import STEPS, simulate

    # As the test does: the watchdogs wait on real time, not the simulation's.
    ledger_module.TXN_WATCHDOG_S = 600.0
    ledger_module.OFFSETS_WATCHDOG_S = 600.0
    try:
        sim = simulate(seed, STEPS)
        check(sim)
        check_rules(sim)
        audited(sim)
        assert sim.world.run_events(), "the simulation produced no runs"
    except Exception as exc:  # noqa: BLE001
        return "loop", seed, _first_line(exc)
    return "loop", seed, ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    where = traceback.extract_tb(exc.__traceback__)[-1]
    head = text[0] if text else type(exc).__name__
    return f"{type(exc).__name__}: {head[:300]} ({os.path.basename(where.filename)}:{where.lineno})"


def _task(job: tuple[str, int]) -> tuple[str, int, str]:
    kind, seed = job
    return _pure(seed) if kind == "pure" else _loop(seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seeds", type=int, default=int(os.environ.get("CRONLOG_SIM_SEEDS", "2000"))
    )
    parser.add_argument(
        "--loop-seeds", type=int, default=int(os.environ.get("CRONLOG_LOG_SIM_SEEDS", "50"))
    )
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    jobs = [("loop", s) for s in range(args.start, args.start + args.loop_seeds)]
    jobs += [("pure", s) for s in range(args.start, args.start + args.seeds)]
    began = time.monotonic()
    done: dict[str, int] = {"pure": 0, "loop": 0}
    failed: list[tuple[str, int, str]] = []
    last = began
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        for kind, seed, error in pool.imap_unordered(_task, jobs, chunksize=1):
            done[kind] += 1
            if error:
                failed.append((kind, seed, error))
                print(f"FAIL {kind} seed {seed}: {error}", flush=True)
            if time.monotonic() - last > 10:
                last = time.monotonic()
                rate = sum(done.values()) / (last - began)
                print(f"... {done} in {last - began:.0f} s ({rate:.1f} seeds/s)", flush=True)
    total = time.monotonic() - began
    print(
        f"{done['pure']} pure and {done['loop']} loop seeds from {args.start} in {total:.1f} s "
        f"({sum(done.values()) / total:.2f} seeds/s on {args.workers} processes); "
        f"{len(failed)} failed"
    )
    for kind in ("pure", "loop"):
        seeds = sorted(seed for k, seed, _ in failed if k == kind)
        if seeds:
            print(f"failing {kind} seeds: {' '.join(map(str, seeds))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
