"""Clocks skewed for real, per process: the environment that puts a process's wall clock
off by an offset, for tests that skew a node's or a worker's clock.

How the clocks are skewed: Debian's libfaketime, preloaded into the process (not through
the `faketime` wrapper, which forks and would take the SIGKILL meant for the worker). Its
children (the node's ledger, the worker's executor) inherit it; the jobs do not (a worker
passes them a fixed environment), so their marks are on the machine's true clock, which
is also the broker's.

What libfaketime 0.9.10 (Debian 12) does to the monotonic clock, and the fix-up here:

- By default it fakes CLOCK_MONOTONIC too, as the faked *wall* clock (about 1.8e9 s).
  Python's timed lock waits (`sem_clockwait` on CLOCK_MONOTONIC, not intercepted) then
  wait until the real monotonic clock reaches that: `threading.Event().wait(0.5)` never
  returns (wolfcw/libfaketime#390). So FAKETIME_DONT_FAKE_MONOTONIC=1: durations stay
  true, which is also what a machine with a wrong wall clock has.
- With it, libfaketime still shifts CLOCK_MONOTONIC deadlines by the offset in
  `clock_nanosleep` (Python's `time.sleep` fails with EINVAL, #426, fixed upstream after
  0.9.10) and in `pthread_cond_timedwait` on monotonic condition variables, and it does
  not translate C11 `cnd_timedwait` deadlines, which librdkafka computes from the faked
  wall clock (so a librdkafka 10 minutes ahead waits 10 minutes longer on every timed
  wait, and one 8 s behind spins). A small preload shim, compiled here, passes monotonic
  waits to glibc untouched and translates `cnd_timedwait` deadlines to the real clock.
  The wall clock (time(), gettimeofday, clock_gettime(CLOCK_REALTIME), timespec_get)
  stays faked by libfaketime.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <threads.h>
#include <time.h>

#define COND_CLOCK_MONOTONIC 2 /* glibc: bit 1 of a condvar's __wrefs is its clock */

static void *libc_symbol(const char *name, const char *version) {
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    return libc ? dlvsym(libc, name, version) : NULL;
}

/* A CLOCK_REALTIME deadline computed from the faked clock, on the real clock. */
static struct timespec real_deadline(const struct timespec *faked) {
    static int (*real_gettime)(clockid_t, struct timespec *);
    struct timespec fake_now, real_now, out;
    if (real_gettime == NULL) real_gettime = libc_symbol("clock_gettime", "GLIBC_2.17");
    clock_gettime(CLOCK_REALTIME, &fake_now); /* libfaketime's */
    real_gettime(CLOCK_REALTIME, &real_now);
    long long ns = (faked->tv_sec - fake_now.tv_sec + real_now.tv_sec) * 1000000000LL
                 + faked->tv_nsec - fake_now.tv_nsec + real_now.tv_nsec;
    if (ns < 0) ns = 0;
    out.tv_sec = ns / 1000000000LL;
    out.tv_nsec = ns % 1000000000LL;
    return out;
}

int cnd_timedwait(cnd_t *cond, mtx_t *mutex, const struct timespec *deadline) {
    static int (*real)(cnd_t *, mtx_t *, const struct timespec *);
    if (real == NULL) real = libc_symbol("cnd_timedwait", "GLIBC_2.28");
    struct timespec at = real_deadline(deadline);
    return real(cond, mutex, &at);
}

int pthread_cond_timedwait(pthread_cond_t *cond, pthread_mutex_t *mutex,
                           const struct timespec *deadline) {
    static int (*faked)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
    if (cond->__data.__wrefs & COND_CLOCK_MONOTONIC)
        return pthread_cond_clockwait(cond, mutex, CLOCK_MONOTONIC, deadline);
    if (faked == NULL) faked = dlvsym(RTLD_NEXT, "pthread_cond_timedwait", "GLIBC_2.3.2");
    return faked(cond, mutex, deadline);
}

int clock_nanosleep(clockid_t clock, int flags, const struct timespec *request,
                    struct timespec *remain) {
    static int (*real)(clockid_t, int, const struct timespec *, struct timespec *);
    static int (*faked)(clockid_t, int, const struct timespec *, struct timespec *);
    if (clock == CLOCK_MONOTONIC) {
        if (real == NULL) real = libc_symbol("clock_nanosleep", "GLIBC_2.17");
        return real(clock, flags, request, remain);
    }
    if (faked == NULL) faked = dlsym(RTLD_NEXT, "clock_nanosleep");
    return faked(clock, flags, request, remain);
}
"""

# Run in a skewed process: its clocks against the parent's, and the waits that broke.
PROBE = """
import json, sys, threading, time
wall, mono = time.time(), time.monotonic()
started = time.monotonic()
time.sleep(0.05)
threading.Event().wait(0.05)
print(json.dumps([wall - float(sys.argv[1]), mono - float(sys.argv[2]),
                  time.monotonic() - started]))
"""


def _libfaketime() -> str | None:
    for pattern in (
        "/usr/lib/*/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
        "/usr/local/lib/faketime/libfaketimeMT.so.1",
    ):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


Skew = Callable[[str], dict[str, str]]


def skew_env(where: Path) -> Skew:
    """The environment that puts a process's wall clock `offset` off (libfaketime), its
    shim built in `where`; skips the test where libfaketime or a C compiler is missing."""
    lib = _libfaketime()
    if shutil.which("faketime") is None or lib is None:
        pytest.skip(
            "Debian's faketime (libfaketime) is not installed: apt-get install faketime "
            "(`cronlog stack up` installs it when run as root)"
        )
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the libfaketime shim: apt-get install gcc libc6-dev")
    (where / "shim.c").write_text(SHIM_C)
    shim = where / "shim.so"
    built = subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(shim), str(where / "shim.c"), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    if built.returncode != 0:
        pytest.skip(f"cannot build the libfaketime shim: {built.stderr.strip()[:800]}")

    def env(offset: str) -> dict[str, str]:
        return {
            "LD_PRELOAD": f"{shim} {lib}",
            "FAKETIME": offset,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    probe = subprocess.run(
        [sys.executable, "-c", PROBE, repr(time.time()), repr(time.monotonic())],
        env={**os.environ, **env("+10m")},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    wall, mono, waited = json.loads(probe.stdout)
    assert 599 < wall < 605, f"the wall clock is not 10 min ahead: {wall}"
    assert -1 < mono < 5, f"the monotonic clock is faked: {mono}"
    assert 0.09 < waited < 1, f"waits are distorted: {waited}"
    return env
