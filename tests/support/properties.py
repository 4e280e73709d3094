"""How many examples a property test runs: all of them in `make test`, a tenth (at least 20) in
`make test-fast` (RUNLEDGER_TESTS_FAST=1), so the fast tier stays a one-minute loop while CI runs each
property at its full count."""

from __future__ import annotations

import os


def examples(n: int) -> int:
    return max(20, n // 10) if os.environ.get("RUNLEDGER_TESTS_FAST") == "1" else n
