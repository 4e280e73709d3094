"""Storage: events written by the real writer read back through the SQL views; compaction keeps
every row exactly once; the index of stored sequence numbers."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from runledger import queries
from runledger.ledger.storage import compaction, paths, store
from runledger.ledger.storage.files import partition_dir
from runledger.ledger.storage.index import SeqIndex
from support.properties import examples
from support.runs import Producer, canonical, step_payload

T0 = "2026-11-29T10:00:00.000000Z"


def one(con, sql: str):
    return con.execute(sql).fetchone()


def test_views_read_what_the_writer_wrote_and_steps_keep_the_latest_attempt(root):
    first, resumed = Producer(attempt=0), Producer(attempt=1)
    sseq = iter(range(1, 100))
    rows = [canonical(first.event("step", step_payload(10.0 - s), s, next(sseq))) for s in range(5)]
    rows += [canonical(resumed.event("step", step_payload(100.0 + s), s, next(sseq))) for s in (3, 4)]  # re-done
    store.write_events(root, rows[:5])
    store.write_events(root, rows[5:])

    con = queries.connect(root)
    assert one(con, "select count(*) from steps_all") == (7,)
    assert one(con, "select count(*), count(distinct step) from steps") == (5, 5)
    latest = dict(con.execute("select step, loss from steps order by step").fetchall())
    assert latest == {0: 10.0, 1: 9.0, 2: 8.0, 3: 103.0, 4: 104.0}
    assert one(con, "select attempt from steps where step = 4") == (1,)
    # the envelope and typed columns come back as written
    assert one(con, "select event_id, producer, seq, prev_hash = '', stream_seq, tokens from steps_all where step = 0 "
                    "and attempt = 0") == ("run-1:worker-0:0:0", "worker-0", 0, True, 1, 1000)
    assert one(con, "select count(*), count(distinct event_id) from events") == (7, 7)
    assert one(con, "select count(*) from events where event_id is null or hash is null or kind is null") == (0,)
    # a kind with no files yet still has its view, with its columns
    assert one(con, "select count(*) from evals") == (0,)
    assert "domain_losses" in [c[0] for c in con.execute("describe evals").fetchall()]


def test_a_connection_reads_its_snapshot_until_it_moves_to_the_next(root):
    p = Producer()
    store.write_events(root, [canonical(p.event("step", step_payload(1.0), 0, 1))])
    con = queries.connect(root)
    store.write_events(root, [canonical(p.event("step", step_payload(2.0), 1, 2))])
    assert one(con, "select count(*) from steps") == (1,)  # what was committed when it connected
    queries.refresh(con, root)
    assert one(con, "select count(*) from steps") == (2,)


def live(part: Path) -> list[Path]:
    """The files of a partition that readers read."""
    return paths.event_files(part.parent.parent.parent, part.parent.name[5:], part.name[7:])


def write_small_files(root: Path, n_files: int, per_file: int = 3) -> tuple[Path, list[str]]:
    p = Producer()
    ids, sseq = [], 1
    for f in range(n_files):
        batch = []
        for _ in range(per_file):
            batch.append(canonical(p.event("step", step_payload(float(sseq)), sseq, sseq)))
            ids.append(batch[-1].env["event_id"])
            sseq += 1
        store.write_events(root, batch)
    return partition_dir(root, "step", "run-1"), ids


def step_ids(root: Path) -> list[str]:
    return sorted(r[0] for r in queries.connect(root).execute("select event_id from steps_all").fetchall())


def test_compaction_goes_by_tiers_so_big_files_are_not_rewritten_each_time(root, monkeypatch):
    part, ids = write_small_files(root, 4)
    big = compaction.compact_partition(part, min_files=4)  # one file of 12 rows
    monkeypatch.setattr(compaction, "TIER_BYTES", (big.stat().st_size, 1 << 30))  # it is above the first tier
    p = Producer(producer="worker-1")
    for i in range(3):
        store.write_events(root, [canonical(p.event("step", step_payload(0.5), i, 100 + i))])
    second = compaction.compact_partition(part, min_files=3)  # the 3 new small files, not the big one
    assert live(part) == sorted([big, second])
    assert pq.read_table(second).num_rows == 3
    for i in range(3, 5):
        store.write_events(root, [canonical(p.event("step", step_payload(0.5), i, 100 + i))])
    assert compaction.compact_partition(part, min_files=5) is None  # 4 files in all: nothing to do
    third = compaction.compact_partition(part, min_files=3)  # the 3 small ones again (5 rows), not the big one
    assert live(part) == sorted([big, third]) and pq.read_table(third).num_rows == 5
    last = compaction.compact_partition(part, min_files=2)  # 1 small file; with the next tier, 2: all of them
    assert live(part) == [last] and pq.read_table(last).num_rows == 17
    assert step_ids(root) == sorted(ids + [f"run-1:worker-1:0:{i}" for i in range(5)])


def test_compaction_keeps_every_row_exactly_once(root):
    part, ids = write_small_files(root, 5)
    assert len(live(part)) == 5
    assert compaction.compact_partition(part, min_files=6) is None  # not enough files: nothing done

    out = compaction.compact_partition(part, min_files=2)
    assert out is not None and live(part) == [out]
    assert len(list(part.glob("*.parquet"))) == 6  # the replaced files stay for readers of the old snapshot
    assert step_ids(root) == sorted(ids)
    assert pq.read_table(out).column("stream_seq").to_pylist() == list(range(1, 16))  # in stream order

    # a second round folds the compacted file with new small files, still exactly once
    p = Producer(producer="worker-1")
    store.write_events(root, [canonical(p.event("step", step_payload(0.5), 99, 100))])
    store.write_events(root, [canonical(p.event("step", step_payload(0.5), 100, 101))])
    compaction.compact_partition(part, min_files=2)
    assert len(live(part)) == 1
    assert step_ids(root) == sorted(ids + ["run-1:worker-1:0:0", "run-1:worker-1:0:1"])


def test_seq_index_membership_with_out_of_order_adds():
    idx = SeqIndex()
    chain = ("run-1", "worker-0", 0)
    for seq in (3, 1, 0, 5):
        idx.add((*chain, seq))
    assert [s for s in range(8) if (*chain, s) in idx] == [0, 1, 3, 5]
    assert len(idx) == 4
    idx.add((*chain, 2))
    idx.add((*chain, 1))  # again: no change
    assert [s for s in range(8) if (*chain, s) in idx] == [0, 1, 2, 3, 5]
    assert len(idx) == 5
    assert idx.chains[chain][0] == 4  # everything below 4 is stored: kept as a bound, not a set
    assert ("run-1", "worker-0", 1, 0) not in idx and ("run-2", "worker-0", 0, 0) not in idx


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 1), st.integers(0, 30)), max_size=60),
       st.integers(1, 8))
def test_seq_index_add_all_is_add_one_by_one(keys, batch):
    """Batches of keys, in any order, with repeats and gaps: the same index as adding each alone."""
    keys = [(run, "w", attempt, seq) for run, attempt, seq in keys]
    one, many = SeqIndex(), SeqIndex()
    for k in keys:
        one.add(k)
    for i in range(0, len(keys), batch):
        many.add_all(keys[i:i + batch])
    assert {c: (v[0], sorted(v[1])) for c, v in one.chains.items()} == {c: (v[0], sorted(v[1])) for c, v in many.chains.items()}


def test_seq_index_add_all_moves_the_bound_in_one_step():
    idx = SeqIndex()
    idx.add_all([("r", "w", 0, s) for s in range(1000)])
    idx.add_all([("r", "w", 0, s) for s in range(1000, 2000)])
    assert idx.chains[("r", "w", 0)] == [2000, set()] and len(idx) == 2000


def test_seq_index_load_from_a_root(root):
    a0, a1, gappy = Producer(attempt=0), Producer(attempt=1), Producer(producer="agent-x")
    rows = [canonical(a0.event("step", step_payload(1.0), s, s + 1)) for s in range(4)]
    rows += [canonical(a1.event("step", step_payload(1.0), s, s + 10)) for s in range(2)]
    g = [canonical(gappy.event("alert", {"alert_id": f"a{i}", "agent": "agent-x", "rule": "r", "message": "m"}, None, 20 + i))
         for i in range(5)]
    rows += [g[0], g[1], g[3], g[4]]  # seq 2 of agent-x is missing, and seq 4 is stored twice
    store.write_events(root, rows)
    store.write_events(root, [g[4]])

    idx = SeqIndex.load(root)
    assert all((("run-1", "worker-0", 0, s) in idx) == (s < 4) for s in range(6))
    assert all((("run-1", "worker-0", 1, s) in idx) == (s < 2) for s in range(4))
    assert [s for s in range(6) if ("run-1", "agent-x", 0, s) in idx] == [0, 1, 3, 4]
    assert len(idx) == 4 + 2 + 4
    assert len(SeqIndex.load(root / "nothing-here")) == 0


def test_connect_lists_the_files_again_when_one_was_compacted_away(root, monkeypatch):
    """A view bound to a file that is gone by the time DuckDB opens it: connect starts over rather than fail."""
    p = Producer()
    store.write_events(root, [canonical(p.event("step", step_payload(1.0), 0, 1))])
    real, calls = queries.render_views, []

    def racing(root_, files=None, at=None):
        calls.append(1)
        if len(calls) == 1:  # the first listing names a file that is gone by the time DuckDB opens it
            return real(root_, {"step": [Path(root_) / "events" / "kind=step" / "run_id=run-1" / "gone.parquet"]})
        return real(root_, files, at)

    monkeypatch.setattr(queries, "render_views", racing)
    con = queries.connect(root)
    assert len(calls) == 2 and con.execute("select count(*) from steps").fetchone() == (1,)


def test_view_statements_are_duckdbs_statements_of_the_views(root):
    """connect(uses=) cuts views.sql where a line starts a definition, not with DuckDB's parser: the same statements,
    in order, one view or macro each, and together the text render_views gives; a root whose path holds what looks
    like a definition or a placeholder is read as a path."""
    p = Producer()
    store.write_events(root, [canonical(p.event("step", step_payload(1.0), 0, 1))])
    con = queries.open_connection()
    for where in (root, root.parent / "x\ncreate or replace view steps as select 1 {{all_kinds}}"):
        if where != root:
            root.rename(where)
        ours = queries.view_statements(where)
        theirs = [st.query for st in con.extract_statements(queries.render_views(where))]
        assert "".join(ours) == queries.render_views(where)
        assert [queries._DEFINED.search(st).group(1) for st in ours] == [queries._DEFINED.search(st).group(1) for st in theirs]
        words = lambda sql: queries._COMMENT.sub("", sql).replace(";", " ").split()  # noqa: E731 (comments apart)
        assert [words(st) for st in ours] == [words(st) for st in theirs]
        steps = queries.connect(where, uses="select count(*) from steps")
        assert steps.execute("select count(*) from steps").fetchone() == (1,)


def test_quarantine_keeps_a_lone_surrogate_as_its_escape(tmp_path):
    """A subject or reason holding a lone surrogate (a str from Python can; hypothesis found one in
    test_properties) is written escaped, not refused by Parquet: quarantining must not fail."""
    item = store.Quarantined(7, "runledger.run-1.\ud800", "unknown kind '\ud800' é", b"{}", "x\udfff")
    path = store.write_quarantine(tmp_path, [item])
    row = pq.read_table(path).to_pylist()[0]
    assert (row["subject"], row["reason"], row["event_id"]) == ("runledger.run-1.\\ud800", "unknown kind '\\ud800' é", "x\\udfff")
