"""A warehouse on object storage, what needs no server: its URI, its credentials (a 0600 file, never in
warehouse.json nor in an error), one warehouse per root, and ObjectPath's path arithmetic. The reads and
writes themselves are tested against a real S3 server in tests/integration/test_s3_warehouse.py."""

from __future__ import annotations

import json

import pytest

from runledger.ledger.storage import objects, paths
from runledger.ledger.storage.objects import ObjectPath

SECRET = "s3cr3t-value-never-shown"


@pytest.fixture(autouse=True)
def no_aws(monkeypatch):
    for k in objects.ENV_KEYS:
        monkeypatch.delenv(k, raising=False)


def test_a_warehouse_is_an_s3_uri():
    assert objects.parse("s3://bucket/some/prefix/") == ("bucket", "some/prefix")
    assert objects.parse("s3://bucket") == ("bucket", "")
    for bad in ("/tmp/x", "s3://", "gs://b/p", "file:///tmp"):
        with pytest.raises(ValueError, match="s3://bucket/prefix"):
            objects.parse(bad)


def test_credentials_come_from_a_file_for_its_owner_alone_and_no_error_shows_them(tmp_path):
    f = tmp_path / "creds"
    f.write_text(json.dumps({"access_key": "AK", "secret_key": SECRET}))
    f.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600") as err:
        objects.read_credentials(f)
    assert SECRET not in str(err.value)
    f.chmod(0o600)
    assert objects.read_credentials(f) == {"access_key": "AK", "secret_key": SECRET}
    f.write_text(f"[default]\naws_access_key_id = AK2\naws_secret_access_key = {SECRET}\n")
    assert objects.read_credentials(f) == {"access_key": "AK2", "secret_key": SECRET}
    f.write_text("[default]\n")
    with pytest.raises(ValueError, match="no access key") as err:
        objects.read_credentials(f)


def test_a_root_keeps_its_warehouse_and_its_credentials_in_a_0600_file(tmp_path, monkeypatch):
    root = tmp_path / "root"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AK")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    objects.use_warehouse(root, "s3://bucket/tables/")
    named = json.loads((root / objects.WAREHOUSE_FILE).read_text())
    assert named == {"warehouse": "s3://bucket/tables", "endpoint": "http://127.0.0.1:9", "region": None}
    assert SECRET not in (root / objects.WAREHOUSE_FILE).read_text()
    assert (root / objects.CREDENTIALS_FILE).stat().st_mode & 0o777 == 0o600
    assert json.loads((root / objects.CREDENTIALS_FILE).read_text())["secret_key"] == SECRET
    paths.check_root(root)  # (a root with only these is a ledger root being set up)
    # a process with no AWS_* variable reads them from the root
    for k in objects.ENV_KEYS:
        monkeypatch.delenv(k, raising=False)
    objects.configure(root)
    props = objects.iceberg_properties()
    assert props["s3.secret-access-key"] == SECRET and props["s3.endpoint"] == "http://127.0.0.1:9"
    with pytest.raises(ValueError, match="keeps its tables in s3://bucket/tables"):
        objects.use_warehouse(root, "s3://other/tables")
    assert objects.warehouse_of(tmp_path / "local") is None  # (the default: the tables under the root)
    local = tmp_path / "local"
    local.mkdir()
    (local / paths.MARKER).write_text(json.dumps({"format": "iceberg", "root": str(local)}))
    with pytest.raises(ValueError, match="keeps its tables under the root"):
        objects.use_warehouse(local, "s3://bucket/tables")
    assert not (local / objects.WAREHOUSE_FILE).exists()


def test_a_process_the_root_starts_gets_no_object_store_keys(monkeypatch):
    """The supervisor, nats-server, the chaos rig's children: the keys reach them only through the root's
    0600 file (what the endpoint says is no secret, and stays)."""
    from runledger.ledger import settings

    for k, v in (("AWS_ACCESS_KEY_ID", "id"), ("AWS_SECRET_ACCESS_KEY", "secret"), ("AWS_SESSION_TOKEN", "token"),
                 ("AWS_ENDPOINT_URL", "http://127.0.0.1:1")):
        monkeypatch.setenv(k, v)
    env = settings.child_env()
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & env.keys()
    assert "secret" not in env.values() and env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:1"


def test_an_object_path_joins_names_and_parents_like_a_path():
    p = ObjectPath("s3://b/pre/events/kind=step/run_id=r/part-1.parquet")
    assert p.name == "part-1.parquet" and p.parent == ObjectPath("s3://b/pre/events/kind=step/run_id=r")
    assert p.parent / "x.parquet" == ObjectPath("s3://b/pre/events/kind=step/run_id=r/x.parquet")
    assert p.key == "b/pre/events/kind=step/run_id=r/part-1.parquet"
    assert str(p.relative_to(p.parents[2])) == "kind=step/run_id=r/part-1.parquet"
    assert objects.as_path("s3://b/k") == ObjectPath("s3://b/k") and str(objects.as_path("file:///tmp/x")) == "/tmp/x"
    assert paths._Rebase(__import__("pathlib").Path("/nonexistent"))("s3://b/k/m.json") == ObjectPath("s3://b/k/m.json")
