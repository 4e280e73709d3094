"""The unit tier's rule, enforced: a unit test starts no process, serves no network socket (a server in-process or not)
and compiles no JAX program. A test that needs one of these belongs in tests/integration (or
tests/e2e); here it fails with one line saying so, rather than slowing `make test-fast` unnoticed."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

INET = (socket.AF_INET, socket.AF_INET6)


def _refuse(what: str):
    def refused(*args, **kwargs):
        raise AssertionError(f"a unit test {what}: move it to tests/integration or tests/e2e")
    return refused


@pytest.fixture(autouse=True)
def unit_tier_rule(monkeypatch):
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("starts no child process"))
    real_bind = socket.socket.bind

    def bind(self, address):
        if self.family in INET:
            _refuse("serves no network socket")()
        return real_bind(self, address)

    monkeypatch.setattr(socket.socket, "bind", bind)
    jax_before = "jax" in sys.modules
    yield
    assert jax_before or "jax" not in sys.modules, "a unit test imports JAX: move it to tests/integration"
