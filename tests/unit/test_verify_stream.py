"""`verify` streams: a change anywhere in a million events is still named; `verify --since` checks only
what came after a verify it recorded, and fails when the new events do not continue the chains it
checked; `replay` streams to the same state as the fold of every event in memory."""

from __future__ import annotations

import json
import os
import random
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from bench.replay import make_events
from bench.verify import write_sealed_run
from runledger.ledger.check import chainwalk, rowcheck
from runledger.ledger.check import replay as rp
from runledger.ledger.contract.canonical import event_hash
from runledger.ledger.contract.columns import payload_columns
from runledger.ledger.emit.sink import ParquetSink
from runledger.ledger.storage import paths
from runledger.ledger.storage.rows import Rows, events_table, typed_arrays, typed_columns
from support.processes import verify
from support.runs import (
    RUN,
    build_run,
    ledger_root,  # noqa: F401 (fixtures)
    set_cell,
    steps_file,
)

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)

# ---------------------------------------------------------------------------------------- verify --since


def add_steps(root: Path, n: int, prev_hash: str | None = None) -> None:
    """`n` more step events of RUN's chain worker-0:0 of build_run (attempt 1), continuing it unless
    `prev_hash` says what the first must link to instead."""
    head = json.loads((root / "heads" / f"run_id={RUN}.json").read_text())
    (links,) = [c for c in head["chains"] if c["producer"] == "worker-0" and c["attempt"] == 1]
    sink = ParquetSink(root, RUN, "worker-0", 1)
    sink._seq, sink._prev_hash = links["seq"] + 1, links["hash"] if prev_hash is None else prev_hash
    sink.emit_dicts("step", [{"loss": 2.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 1000, "step_time_s": 0.1}] * n,
                    list(range(100, 100 + n)))
    sink.close()


def test_verify_since_checks_only_the_new_events_and_moves_on(root, tmp_path):
    build_run(root)
    record = tmp_path / "verified.json"
    rc, out = verify(root, "--record", str(record))
    assert rc == 0 and record.exists(), out
    add_steps(root, 7)
    rc, out = verify(root, "--since", str(record), "--format", "json")
    summary = json.loads(out)
    assert rc == 0 and summary["ok"], out
    assert summary["checked_events"] == 7 and summary["events"] == 18 + 7
    rc, out = verify(root, "--since", str(record), "--format", "json")  # the record moved on: nothing new
    assert rc == 0 and json.loads(out)["checked_events"] == 0, out


def test_verify_since_fails_when_the_new_events_do_not_continue_the_recorded_heads(root, tmp_path):
    build_run(root)
    record = tmp_path / "verified.json"
    assert verify(root, "--record", str(record))[0] == 0
    add_steps(root, 3, prev_hash="f" * 64)  # sealed and hashed right, but linked to no event verified
    rc, out = verify(root, "--since", str(record))
    assert rc == 1 and "prev_hash does not match the hash of seq" in out, out
    assert json.loads(record.read_text())["events"] == 18  # a failed check does not move the record


def test_verify_since_names_a_file_changed_after_it_was_verified(root, tmp_path):
    build_run(root)
    record = tmp_path / "verified.json"
    assert verify(root, "--record", str(record))[0] == 0
    (f,) = paths.event_files(root, "step", RUN)
    t = pq.read_table(f)
    pq.write_table(t.set_column(t.schema.get_field_index("loss"), "loss", pc.multiply(t.column("loss"), 0.5)), f)
    rc, out = verify(root, "--since", str(record))
    assert rc == 1 and f"{f}: changed since it was verified" in out and "column loss =" in out, out


def test_verify_since_assuming_unchanged_reads_only_what_changed_by_size_or_mtime(root, tmp_path):
    """--assume-unchanged trusts a file whose size and mtime are as recorded (what it costs: an edit
    that keeps both is not seen, which the default check, hashing every file again, names); a file
    whose mtime moved is read and checked again."""
    build_run(root)
    record = tmp_path / "verified.json"
    assert verify(root, "--record", str(record))[0] == 0
    f = max(paths.event_files(root, "step", RUN), key=lambda p: p.stat().st_size)  # a file checked before
    add_steps(root, 4)
    rc, out = verify(root, "--since", str(record), "--record", str(tmp_path / "r2.json"), "--assume-unchanged", "--format", "json")
    assert rc == 0 and json.loads(out)["checked_events"] == 4, out
    before = f.stat()
    data = bytearray(f.read_bytes())  # a byte changed in place, size and mtime kept
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))
    rc, out = verify(root, "--since", str(record), "--assume-unchanged")
    assert rc == 0, out  # not seen: the price of the option
    rc, out = verify(root, "--since", str(record))
    assert rc == 1 and f"{f}: changed since it was verified" in out, out
    os.utime(f)  # its mtime moves: read again, and named, with the option too
    rc, out = verify(root, "--since", str(record), "--assume-unchanged")
    assert rc == 1 and f"{f}: changed since it was verified" in out, out


def test_assume_unchanged_needs_since(root):
    build_run(root)
    rc, out = verify(root, "--assume-unchanged")
    assert rc == 2 and "--since" in out, out


def test_verify_since_without_a_record_is_bad_usage(root, tmp_path):
    build_run(root)
    rc, out = verify(root, "--since", str(tmp_path / "nope.json"))
    assert rc == 2 and "--record" in out


# ---------------------------------------------------------------------------------------- the chain walk


def links(rows: list[tuple[int, str, str]]) -> pa.Table:
    return pa.table({"run_id": ["r"] * len(rows), "producer": ["w"] * len(rows), "attempt": [0] * len(rows),
                     "seq": [r[0] for r in rows], "prev_hash": [r[1] for r in rows], "hash": [r[2] for r in rows],
                     "event_id": [f"r:w:0:{r[0]}" for r in rows]})


def chain_rows(n: int) -> list[tuple[int, str, str]]:
    return [(s, "" if s == 0 else f"h{s - 1}", f"h{s}") for s in range(n)]


def test_the_walk_takes_events_out_of_turn_and_names_gaps_and_copies():
    rows = chain_rows(8)
    walk = chainwalk.ChainWalk()
    walk.take(links([rows[0], rows[2], rows[1], rows[3], rows[3], rows[5], rows[6]]))  # 4 missing, 3 twice
    walk.finish()
    assert walk.problems() == ["r:w:0:3: stored 2 times", "r:w:0:4 missing: seq 4..4 of r:w:0 (gap before r:w:0:5)"]


def test_an_event_later_than_the_walk_waits_is_settled_by_the_exact_check():
    rows = chain_rows(10)
    walk = chainwalk.ChainWalk(pending_max=2)
    walk.take(links([rows[0], *rows[2:8], rows[1], *rows[8:]]))  # seq 1 comes after the walk gave it up
    walk.finish()
    key = ("r", "w", 0)
    assert walk.chains[key].recheck and walk.problems() == []
    assert chainwalk.sorted_check(key, [(s, p, h, f"r:w:0:{s}") for s, p, h in rows]) == ([], [])


def test_the_walk_takes_runs_whole_as_it_takes_them_a_row_at_a_time(monkeypatch):
    """Rows of one chain in seq order are taken whole (`ChainWalk._take_run`); the answer is the row walk's
    for chains with gaps, copies, broken links and blocks out of order, cut into batches anyhow."""
    rng = random.Random(23)
    for _ in range(150):
        rows = [(key, s) for key in (("r", "a", 0), ("r", "b", 1)) for s in range(rng.randint(1, 120))]
        rows = [[key, s, "" if s == 0 else f"{key[1]}{s - 1}", f"{key[1]}{s}"] for key, s in rows]
        for _ in range(rng.randint(0, 5)):
            i = rng.randrange(len(rows))
            change = rng.randrange(4)
            if change == 0:
                rows.pop(i)  # a gap
            elif change == 1:
                rows.insert(rng.randrange(len(rows)), list(rows[i]))  # a copy
            elif change == 2:
                rows[i][2] = "x"  # a broken link
            else:
                block = rows[i:i + rng.randint(1, 30)]  # stored out of order
                del rows[i:i + len(block)]
                j = rng.randrange(len(rows) + 1)
                rows[j:j] = block
        cuts = sorted(rng.sample(range(1, len(rows)), min(len(rows) - 1, rng.randint(0, 6)))) if len(rows) > 1 else []
        batches = [pa.table({"run_id": [r[0][0] for r in part], "producer": [r[0][1] for r in part],
                             "attempt": [r[0][2] for r in part], "seq": [r[1] for r in part],
                             "prev_hash": [r[2] for r in part], "hash": [r[3] for r in part],
                             "event_id": [":".join(map(str, (*r[0], r[1]))) for r in part]})
                   for part in (rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)]))]
        pending_max = rng.choice([3, 40, chainwalk.PENDING_MAX])
        walks = []
        for run_min_rows in (chainwalk.RUN_MIN_ROWS, len(rows) + 1):  # runs whole, then every row alone
            monkeypatch.setattr(chainwalk, "RUN_MIN_ROWS", run_min_rows)
            walk = chainwalk.ChainWalk(pending_max=pending_max)
            walk.watch(("r", "a", 0), 7)
            for batch in batches:
                walk.take(batch)
            walk.finish()
            walks.append((walk.problems(), {k: (c.next_seq, c.last_hash, c.max_seq, c.watch, c.gaps, c.recheck)
                                            for k, c in walk.chains.items()}))
        assert walks[0] == walks[1]


def test_chains_linked_from_the_parts_summaries_are_the_exact_check():
    """Each part (a file, or some of its rows) summarised on its own (`chainwalk.Summariser`) and the
    chains linked from the segments of all parts (`ChainWalk.take_sorted`): gaps, copies, broken links,
    blocks out of order, chains interleaved, cut into parts anyhow: the exact sorted check's answer, or
    the chain is left to it (`recheck`); and the hashes at the watched seqs are the first stored."""
    rng = random.Random(2023)
    for _ in range(300):
        chains = (("r", "a", 0), ("r", "b", 1))
        rows = [[key, s, "" if s == 0 else f"{key[1]}{s - 1}", f"{key[1]}{s}"] for key in chains for s in range(rng.randint(1, 90))]
        if rng.random() < 0.3:
            rng.shuffle(rows)  # interleaved row by row
        for change in sorted(rng.randrange(4) for _ in range(rng.randint(0, 5))):  # (links broken before copies made)
            i = rng.randrange(len(rows))
            if change == 0 and len(rows) > 1:
                rows.pop(i)  # a gap
            elif change == 1:
                rows[i][2] = "x"  # a broken link
            elif change == 2:
                block = [list(r) for r in rows[i:i + rng.randint(1, 5)]]  # stored again (the same content)
                j = rng.randrange(len(rows) + 1)
                rows[j:j] = block
            else:
                block = rows[i:i + rng.randint(1, 30)]  # stored out of order
                del rows[i:i + len(block)]
                j = rng.randrange(len(rows) + 1)
                rows[j:j] = block
        for n, r in enumerate(rows):
            r.append(n)  # its stream_seq: the rows' order is the order they were stored in
        cuts = sorted(rng.sample(range(1, len(rows)), min(len(rows) - 1, rng.randint(0, 6)))) if len(rows) > 1 else []
        parts = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, len(rows)])]
        watched = {("a", 0): {0, 7}, ("b", 1): {3}}
        walk = chainwalk.ChainWalk()
        for (producer, attempt), seqs in watched.items():
            for seq in seqs:
                walk.watch(("r", producer, attempt), seq)
        summaries = []
        for part in parts:
            summariser = chainwalk.Summariser("r", watched)
            for a in range(0, len(part), 7):  # batches of 7 rows: segments go on across batches
                b = part[a:a + 7]
                summariser.take(pa.record_batch({
                    "run_id": [r[0][0] for r in b], "producer": [r[0][1] for r in b], "attempt": [r[0][2] for r in b],
                    "seq": [r[1] for r in b], "prev_hash": [r[2] for r in b], "hash": [r[3] for r in b],
                    "event_id": [":".join(map(str, (*r[0], r[1]))) for r in b], "stream_seq": [r[4] for r in b]}))
            summaries.append(summariser.summary)
        by_chain = {}
        for summary in summaries:
            for seg in summary.segments:
                by_chain.setdefault(("r", seg.producer, seg.attempt), []).append(seg)
        for key, segments in by_chain.items():
            walk.take_sorted(key, sorted(segments, key=lambda seg: (seg.first, seg.stream_seq)))
        for summary in summaries:
            walk.take_seen(summary)
        walk.finish()
        for key in chains:
            exact = chainwalk.sorted_check(key, [(r[1], r[2], r[3], ":".join(map(str, (*key, r[1])))) for r in rows if r[0] == key])
            links = walk.chains.get(key)
            if links is None or links.recheck:
                continue
            assert [p for p in walk.problems() if p.startswith(":".join(map(str, key)) + ":")] == [*exact[0], *exact[1]], rows
            first_stored = {}
            for r in rows:
                first_stored.setdefault((r[0], r[1]), r[3])
            for seq in watched[key[1:]]:
                assert walk.hash_at(key, seq) == first_stored.get((key, seq)), (key, seq, rows)


def test_verify_reads_the_link_columns_once_and_walks_interleaved_chains_from_the_files(ledger_root, monkeypatch):
    """A run of the usual layout is linked from the parts' summaries, without reading its files again;
    a run whose summaries would hold too much, or whose chains are interleaved row by row in a file (too
    many segments), is walked from its files."""
    from runledger.ledger.check import verify as v
    from runledger.ledger.storage import streams

    walked = []
    real = streams.in_stream_order
    monkeypatch.setattr(v.streams, "in_stream_order", lambda files, *a, **k: walked.append(files) or real(files, *a, **k))
    report = v.verify(ledger_root, jobs=1)
    assert report.ok and report.events == 18 and walked == [], report.text()

    monkeypatch.setattr(v, "SEGMENTS_HELD", 1)  # the summaries of the runs not yet linked hold too much
    report = v.verify(ledger_root, jobs=1)
    assert report.ok and report.events == 18 and walked, report.text()
    monkeypatch.setattr(v, "SEGMENTS_HELD", 1 << 30)
    walked.clear()
    monkeypatch.setattr(chainwalk, "SEGMENTS_FLOOR", 0)  # every part now makes too many segments to hand on
    monkeypatch.setattr(chainwalk, "SEGMENT_ROWS", 1 << 30)
    report = v.verify(ledger_root, jobs=1)
    assert report.ok and report.events == 18 and walked, report.text()
    (f,) = paths.event_files(ledger_root, "step", RUN)
    t = pq.read_table(f)  # a link cut: still named when the run is walked from its files
    pq.write_table(set_cell(t, "prev_hash", 2, "0" * 64), f)
    assert "prev_hash does not match the hash of seq" in v.verify(ledger_root, jobs=1).text()


# ---------------------------------------------------------------------------------------- the row checks


def test_the_typed_columns_written_and_checked_are_the_reference_ones_for_every_kind():
    """`typed_arrays` (what the writer stores and the vectorised check compares with) against
    `typed_columns` (the reference, one payload at a time, which names a row that fails)."""
    by_kind: dict[str, list[dict]] = {}
    for e in make_events(42_000):  # every kind of a training run's ledger, decisions and alerts too
        by_kind.setdefault(e["kind"], []).append(e["payload"])
    by_kind["metrics"] = [{"metrics": {"loss": 1.5, "acc": 0.5}}, {"metrics": {"loss": None, "ppl": 3}, "nonfinite": {"loss": "nan"}}]
    for kind, payloads in by_kind.items():
        payloads = payloads[:300]
        n = len(payloads)
        written = events_table(kind, Rows([{"payload": p} for p in payloads], [None] * n, [0] * n),
                                     datetime.now(timezone.utc))
        made = typed_arrays(kind, payloads)
        reference = typed_columns(kind, payloads)
        columns = [c for c in written.schema.names if c.split("/", 1)[0] in payload_columns(kind)]
        assert sorted(made) == sorted(columns) == sorted(reference), kind
        for c in columns:
            assert made[c].equals(written.column(c).combine_chunks()), (kind, c)
            assert made[c].equals(pa.array(reference[c], made[c].type)), (kind, c)


def test_payload_texts_shifted_between_two_rows_are_named(ledger_root):
    """Two rows' payload texts cut at another place (hashes made anew): their list is canonical JSON as a
    whole, yet neither text is; the batch check must not be fooled by the whole."""
    table = pq.read_table(steps_file(ledger_root))
    i = 2
    texts = table.column("payload").to_pylist()
    cut = texts[i].index(",") + 1  # the first of row i's fields stays, the rest goes to row i + 1
    texts[i], texts[i + 1] = texts[i][:cut - 1], texts[i][cut:] + "," + texts[i + 1]
    table = set_cell(set_cell(table, "payload", i, texts[i]), "payload", i + 1, texts[i + 1])
    for j in (i, i + 1):
        table = set_cell(table, "hash", j, event_hash(table.slice(j, 1).to_pylist()[0], texts[j]))
    batch = table.combine_chunks().to_batches()[0]
    joined, _ = rowcheck._json_array(batch.column("payload"))
    assert orjson.dumps(orjson.loads(joined), option=orjson.OPT_SORT_KEYS) == joined  # the whole is canonical
    assert not rowcheck.batch_ok(batch, "step", RUN)
    problems = rowcheck.row_problems(batch.to_pylist(), "step", RUN, "here")
    assert [p.split(" ")[0] for p in problems] == [table.column("event_id")[j].as_py() for j in (i, i + 1)], problems


@pytest.mark.parametrize("texts, canonical", [
    (['{"a":1,"b":2}', '{"c":3}'], True),
    (['{"a":1', '"b":2},{"c":3}'], False),  # the same list, cut elsewhere
    (['{"a":[{"x":1},{"y":2}]}', '{"b":1}'], True),  # "},{" inside a text too
    (['{"a":[{"x":1}', '{"y":2}]},{"b":1}'], False),  # ... and the list cut there
    (['{"b":1,"a":2}', '{"c":3}'], False),  # keys out of order
])
def test_the_batch_check_of_canonical_texts_keeps_each_text_apart(texts, canonical):
    column = pa.array(texts)
    joined, offsets = rowcheck._json_array(column)
    payloads = orjson.loads(joined)
    assert len(payloads) == len(texts)
    assert rowcheck._canonical_as_joined(payloads, joined, offsets) is canonical
    assert rowcheck._canonical_one_by_one(payloads, column) is canonical  # the slower way agrees


# ---------------------------------------------------------------------------------------- replay


def test_streamed_replay_is_the_fold_of_every_event(root):
    marks = build_run(root)
    for as_of in (None, *marks.values(), 1):
        streamed = rp.replay_run(root, RUN, as_of)
        folded = rp.replay(RUN, rp.run_events(root, RUN, as_of))
        assert streamed.to_json() == folded.to_json(), as_of


def test_replay_opens_a_file_when_the_stream_reaches_it(tmp_path, monkeypatch):
    """Memory is a batch per open file: the files of a kind written one after another are open one at
    a time (all of them were open at once: 1.2 GB for 10M events)."""
    root = tmp_path / "root"
    write_sealed_run(root, 30_000, run_id="big", flush_events=5_000, compact=False)
    assert len(paths.event_files(root, "step", "big")) >= 5
    file_batches, open_now, most = rp._file_batches, set(), [0]

    def counted(path, columns, as_of_seq):
        open_now.add(path)
        most[0] = max(most[0], len(open_now))
        yield from file_batches(path, columns, as_of_seq)
        open_now.discard(path)

    monkeypatch.setattr(rp, "_file_batches", counted)
    state = rp.replay_run(root, "big")
    assert state.events == 30_000 and most[0] <= 3  # a step, an eval and a checkpoint file at most
    monkeypatch.setattr(rp, "_file_batches", file_batches)
    assert state.to_json() == rp.replay("big", rp.run_events(root, "big")).to_json()


def test_step_tokens_count_a_redone_step_once_and_forget_steps_after_a_resume():
    tokens = rp.StepTokens()
    assert [tokens.put(s, 10) for s in range(5)] == [0] * 5 and tokens.runs == [[0, 4, 10]]
    assert tokens.put(2, 7) == 10 and tokens.runs == [[0, 1, 10], [2, 2, 7], [3, 4, 10]]
    assert tokens.drop_after(2) == 20 and tokens.runs == [[0, 1, 10], [2, 2, 7]]
