"""Helpers the tests share, each defined once: processes and the CLI (`processes`), reading a root
(`reading`), synthetic ledgers and events, servers and browsers. Fixtures built on them live in
tests/conftest.py or beside the helper, imported by the tests that take them."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
