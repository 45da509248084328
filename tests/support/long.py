"""Whether the long versions of the fault scenarios run (`make chaos` sets it)."""

from __future__ import annotations

import os

LONG_TESTS = os.environ.get("CRONLOG_LONG_TESTS") == "1"
