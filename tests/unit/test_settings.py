"""Settings are resolved in one place (`runledger.ledger.settings`): a flag, else its environment variable, else
the default; and the views' columns a query reads without the contract are the contract's, or not read."""

from __future__ import annotations

import json
import os

import pytest

from runledger.ledger import settings
from runledger.queries import columns


@pytest.fixture
def no_settings_env(monkeypatch):
    for name in (settings.ROOT_ENV, settings.NATS_ENV, settings.CREDS_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_root_is_the_flag_else_the_environment_else_the_default(no_settings_env, tmp_path):
    no_settings_env.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert settings.root() == settings.user_root() == str(tmp_path / "data" / "runledger")  # (on Linux)
    no_settings_env.setenv("XDG_DATA_HOME", "relative/data")  # not absolute: ignored, as the XDG spec says
    assert settings.root() == os.path.expanduser("~/.local/share/runledger")
    no_settings_env.setenv(settings.ROOT_ENV, "")  # empty: not set
    assert settings.root() == settings.user_root()
    no_settings_env.setenv(settings.ROOT_ENV, str(tmp_path))
    assert settings.root() == str(tmp_path)
    assert settings.root(tmp_path / "flag") == str(tmp_path / "flag")


def test_the_server_is_the_creds_then_the_flag_then_the_environment_then_the_roots_then_the_default(no_settings_env, tmp_path):
    root = tmp_path / "root"
    assert settings.nats_url(root_dir=root) == settings.DEFAULT_NATS_URL == "nats://127.0.0.1:4222"
    settings.nats_dir(root).mkdir(parents=True)
    (settings.nats_dir(root) / "url").write_text("nats://127.0.0.1:4333\n")  # what `nats up` leaves
    assert settings.nats_url(root_dir=root) == "nats://127.0.0.1:4333"
    no_settings_env.setenv(settings.NATS_ENV, "nats://env:4222")
    assert settings.nats_url(root_dir=root) == "nats://env:4222"
    assert settings.nats_url("nats://flag:4222", root_dir=root) == "nats://flag:4222"
    creds = tmp_path / "worker.creds"
    creds.write_text("nats://worker:pw@127.0.0.1:4333\n")
    no_settings_env.setenv(settings.CREDS_ENV, str(creds))  # a role's credentials win over any URL
    assert settings.nats_url("nats://flag:4222", root_dir=root) == "nats://worker:pw@127.0.0.1:4333"
    other = tmp_path / "agent.creds"
    other.write_text("nats://agent:pw@127.0.0.1:4333\n")
    assert settings.nats_url("nats://flag:4222", other, root) == "nats://agent:pw@127.0.0.1:4333"


def test_a_named_server_is_the_creds_then_the_flag_then_the_environment_else_none(no_settings_env, tmp_path):
    assert settings.named_nats() is None  # none named: a root's own server is meant (`runledger ui` follows it)
    no_settings_env.setenv(settings.NATS_ENV, "nats://env:4222")
    assert settings.named_nats() == "nats://env:4222"
    assert settings.named_nats("nats://flag:4222") == "nats://flag:4222"
    creds = tmp_path / "reader.creds"
    creds.write_text("nats://reader:pw@127.0.0.1:4333\n")
    assert settings.named_nats("nats://flag:4222", creds) == "nats://reader:pw@127.0.0.1:4333"


def test_the_view_columns_are_the_contracts_as_written_for_it():
    """columns_made (what a query reads, without loading the contract) is current: else run
    `python -m runledger.queries.columns`; and a stale one is not read."""
    from runledger.queries import columns_made

    assert columns_made.DIGEST == columns.source_digest(), "run `python -m runledger.queries.columns`"
    made = json.loads(json.dumps(columns._from_contract()))
    assert json.loads(columns_made.LAYOUT) == made
    columns.layout.cache_clear()
    try:
        assert columns.layout() == made
        columns.layout.cache_clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(columns_made, "DIGEST", "stale")
            mp.setattr(columns_made, "LAYOUT", '{"kinds": {"step": [["x from steps; select 1 --", "VARCHAR"]]}}')
            assert columns.layout() == made  # not read: worked out again
    finally:
        columns.layout.cache_clear()
