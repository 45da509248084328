"""Debian packages the test suite uses besides the services, installed by `stack up`.

- `faketime` (libfaketime): the clock-skew tests run a scheduler node and workers with
  their wall clocks minutes or seconds off (tests/integration/test_clock_skew.py);
- `gcc` and `libc6-dev`: those tests build a small preload shim that keeps libfaketime
  0.9.10 (Debian 12) from distorting monotonic and C11 timed waits;
- `chromium`: the dashboard's test drives a real headless browser with Playwright
  (tests/integration/test_ui.py); Playwright cannot download its own browsers here.

Best effort: installed when missing, as root, with apt-get; otherwise (no root, no
apt-get, no network) a note says what is missing, and those tests are skipped with that
reason. A missing test tool never stops the stack.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from connectors.stack.process import Log, StackError, run


def missing_test_packages() -> list[str]:
    present = {
        "faketime": shutil.which("faketime") is not None,
        "gcc": shutil.which("cc") is not None or shutil.which("gcc") is not None,
        "libc6-dev": Path("/usr/include/pthread.h").exists(),
        "chromium": shutil.which("chromium") is not None,
    }
    return [package for package, found in present.items() if not found]


def ensure_test_tools(log: Log) -> None:
    missing = missing_test_packages()
    if not missing:
        return
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        log(
            f"note: the clock-skew and dashboard tests need {', '.join(missing)} "
            f"(apt-get install {' '.join(missing)}, as root); they are skipped without"
        )
        return
    log(f"installing {', '.join(missing)} from Debian's packages (for the tests)")
    # Not configuration: this process's environment handed on to apt-get.
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "-qq", "--no-install-recommends", *missing]
    try:
        try:
            run(install, f"apt-get install {' '.join(missing)}", env=env, timeout_s=900)
        except StackError:  # stale package lists, as on a fresh machine
            run([apt, "update", "-qq"], "apt-get update", env=env, timeout_s=600)
            run(install, f"apt-get install {' '.join(missing)}", env=env, timeout_s=900)
    except StackError as exc:
        log(f"note: could not install {', '.join(missing)} ({exc}); the tests that need them skip")
