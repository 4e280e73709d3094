"""Settings are resolved in one place (`runledger.ledger.settings`): a flag, else its environment variable, else
the default; and the views' columns a query reads from the cache are the contract's, or not read."""

from __future__ import annotations

import json

import pytest

from runledger.ledger import settings
from runledger.queries import columns


@pytest.fixture
def clean_env(monkeypatch):
    for name in (settings.ROOT_ENV, settings.NATS_ENV, settings.CREDS_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_root_is_the_flag_else_the_environment_else_the_default(clean_env, tmp_path):
    assert settings.root() == settings.DEFAULT_ROOT == "./runledger-data"
    clean_env.setenv(settings.ROOT_ENV, str(tmp_path))
    assert settings.root() == str(tmp_path)
    assert settings.root(tmp_path / "flag") == str(tmp_path / "flag")


def test_the_server_is_the_creds_then_the_flag_then_the_environment_then_the_roots_then_the_default(clean_env, tmp_path):
    root = tmp_path / "root"
    assert settings.nats_url(root_dir=root) == settings.DEFAULT_NATS_URL == "nats://127.0.0.1:4222"
    settings.nats_dir(root).mkdir(parents=True)
    (settings.nats_dir(root) / "url").write_text("nats://127.0.0.1:4333\n")  # what `nats up` leaves
    assert settings.nats_url(root_dir=root) == "nats://127.0.0.1:4333"
    clean_env.setenv(settings.NATS_ENV, "nats://env:4222")
    assert settings.nats_url(root_dir=root) == "nats://env:4222"
    assert settings.nats_url("nats://flag:4222", root_dir=root) == "nats://flag:4222"
    creds = tmp_path / "worker.creds"
    creds.write_text("nats://worker:pw@127.0.0.1:4333\n")
    clean_env.setenv(settings.CREDS_ENV, str(creds))  # a role's credentials win over any URL
    assert settings.nats_url("nats://flag:4222", root_dir=root) == "nats://worker:pw@127.0.0.1:4333"
    other = tmp_path / "agent.creds"
    other.write_text("nats://agent:pw@127.0.0.1:4333\n")
    assert settings.nats_url("nats://flag:4222", other, root) == "nats://agent:pw@127.0.0.1:4333"


def test_the_view_columns_come_from_the_contract_and_a_planted_cache_is_not_read(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    columns.layout.cache_clear()
    try:
        made = columns.layout()  # worked out from the contract, and written
        assert made == json.loads(json.dumps(columns._from_contract()))
        (cache,) = (tmp_path / "runledger").glob("columns-*.json")
        assert json.loads(cache.read_text()) == made
        planted = json.loads(cache.read_text())
        planted["kinds"]["step"].append(["x from steps; select 1 --", "VARCHAR"])  # text that would reach SQL
        cache.write_text(json.dumps(planted))
        columns.layout.cache_clear()
        assert columns.layout() == made  # not read: worked out again
        assert json.loads(cache.read_text()) == made
    finally:
        columns.layout.cache_clear()
