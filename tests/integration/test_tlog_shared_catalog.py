"""The last signed checkpoint as a compare-and-swap row of a shared PostgreSQL catalog (a real server,
tests/support/postgres.py): two ledger hosts of one log, each with its own local state and the log's
public files shared (a bucket, as two machines have it). A host taking the log over extends it from the
row (one origin, consistent checkpoints); a host still holding an older size is refused; and of two
hosts signing from the same size at the same moment exactly one signs, the other refuses, so the log
never has two inconsistent checkpoints."""

from __future__ import annotations

import json
import threading

import pytest

from runledger.ledger.storage.signedrows import SignedRows
from runledger.ledger.tlog import checkpoint, merkle, note, tiles
from runledger.ledger.tlog.log import Log, TlogRefused
from support.postgres import PG_BIN, Postgres

pytestmark = pytest.mark.skipif(not PG_BIN.exists(), reason="no PostgreSQL binaries")


@pytest.fixture(scope="module")
def catalog_engine():
    from sqlalchemy import create_engine

    server = Postgres()
    server.start()
    engine = create_engine(server.uri)
    yield engine
    engine.dispose()
    server.stop()


def _host(tmp_path, name: str, signer: note.Signer, engine) -> Log:
    """A ledger host's log of partition p0: its own root (local state), the shared row and public files."""
    lg = Log(tmp_path / name, "p0", signer)
    lg.shared = SignedRows(engine)
    lg.dir = tmp_path / "public" / "tlog" / "p0"  # (the bucket both hosts write the log's public files to)
    lg.open([])
    return lg


def _entries_of(n: int, tag: str) -> list[bytes]:
    return [json.dumps({"attempt": 0, "hash": f"{tag}{i}", "producer": "p", "run_id": "r", "seq": i},
                       separators=(",", ":"), sort_keys=True).encode() for i in range(n)]


def _published(lg: Log, signer: note.Signer) -> checkpoint.Checkpoint:
    return checkpoint.open_signed((lg.dir / tiles.CHECKPOINT).read_text(), [signer.verifier])


def test_a_host_taking_the_log_over_extends_it_and_a_stale_one_is_refused(tmp_path, catalog_engine):
    signer = note.Signer.generate("runledger.test/takeover")
    a = _host(tmp_path, "a", signer, catalog_engine)
    a.append_entries(_entries_of(10, "a"))
    a.sign()
    before = _published(a, signer)
    b = _host(tmp_path, "b", signer, catalog_engine)  # another host: nothing of a's state but the row
    assert b.size == 10
    b.append_entries(_entries_of(5, "b"))
    b.sign()
    after = _published(b, signer)
    assert (after.origin, after.size) == (before.origin, 15)
    node = tiles.Tiles(b.dir).node(after.size)
    merkle.verify_consistency(before.size, after.size, before.root, after.root,
                              merkle.consistency_proof(node, before.size, after.size))
    a.append_entries(_entries_of(3, "stale"))  # the first host, still at 10, goes its own way
    with pytest.raises(TlogRefused):
        a.sign()
    assert _published(b, signer) == after


def test_two_hosts_signing_from_the_same_size_at_once_never_fork_the_log(tmp_path, catalog_engine):
    signer = note.Signer.generate("runledger.test/race")
    first = _host(tmp_path, "first", signer, catalog_engine)
    first.append_entries(_entries_of(20, "x"))
    first.sign()
    base = _published(first, signer)
    racers = [_host(tmp_path, name, signer, catalog_engine) for name in ("c", "d")]
    for lg, n in zip(racers, (2, 4)):  # (different sizes: each one's partial tiles are its own)
        lg.append_entries(_entries_of(n, lg.root.name))
    start, outcome = threading.Barrier(2), {}

    def race(lg: Log) -> None:
        start.wait()
        try:
            lg.sign()
            outcome[lg.root.name] = "signed"
        except TlogRefused:
            outcome[lg.root.name] = "refused"

    threads = [threading.Thread(target=race, args=(lg,)) for lg in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(outcome.values()) == ["refused", "signed"], outcome
    winner = next(lg for lg in racers if outcome[lg.root.name] == "signed")
    row = SignedRows(catalog_engine).get(winner.origin)
    assert row == {"size": winner.size, "root": winner.tree_root().hex()}
    now = _published(winner, signer)
    assert now.size == winner.size
    node = tiles.Tiles(winner.dir).node(now.size)
    merkle.verify_consistency(base.size, now.size, base.root, now.root,
                              merkle.consistency_proof(node, base.size, now.size))
