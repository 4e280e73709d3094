"""A `tiny` run through a real nats-server and the real ledger service: the `steps`, `drops`,
`checkpoints` and `data` views are complete; a resumed attempt (found by replaying the ledger)
redoes nothing and leaves one row per step in `steps`; a fork found through the ledger records its
parent (as `runledger.init(fork_from=)` would) and starts after the parent's checkpoint, its `steps` the
parent's up to there."""

from __future__ import annotations

from runledger.ledger.check.replay import replay_run
from runledger.queries.forks import fork_point
from runledger.tools.cli import main as runledger_main
from support.reading import reader, wait_for_count


def _count(root, sql):
    return reader(root).execute(sql).fetchone()[0]


def test_a_tiny_run_and_its_resumed_attempt_land_complete_in_the_ledger(root, nats_server, ledger_process):
    ledger_process.start()
    common = ["--preset", "tiny", "--run-id", "tinyrun", "--nats", nats_server.url, "--root", str(root)]
    assert runledger_main(["train", *common, "--steps", "6"]) == 0
    assert wait_for_count(root, "select count(*) from checkpoints where run_id = 'tinyrun'", 1) == 1

    assert runledger_main(["train", *common, "--steps", "8", "--resume"]) == 0  # attempt 1, from step 6
    assert wait_for_count(root, "select count(*) from checkpoints where run_id = 'tinyrun'", 2) == 2
    assert wait_for_count(root, "select count(*) from data where run_id = 'tinyrun'", 2) == 2
    assert wait_for_count(root, "select count(*) from steps_all where run_id = 'tinyrun'", 8) == 8
    assert wait_for_count(root, "select count(*) from drops where run_id = 'tinyrun'", 8) == 8
    assert _count(root, "select count(*) from steps where run_id = 'tinyrun'") == 8
    assert _count(root, "select count(distinct step) from steps where run_id = 'tinyrun'") == 8
    assert _count(root, "select max(attempt) from steps where run_id = 'tinyrun' and step > 6") == 1
    assert _count(root, "select count(*) from steps where run_id = 'tinyrun' and loss is null") == 0
    assert wait_for_count(root, "select count(*) from events where run_id = 'tinyrun' and kind = 'run_finished'", 2) == 2

    fork = ["--preset", "tiny", "--run-id", "tinyfork", "--nats", nats_server.url, "--root", str(root)]
    assert runledger_main(["train", *fork, "--fork-from", "tinyrun@7", "--horizon-steps", "9"]) == 0
    assert wait_for_count(root, "select count(*) from events where run_id = 'tinyfork' and kind = 'run_finished'", 1) == 1
    forked = replay_run(root, "tinyfork")
    assert forked.attempts[0]["parent"]["run_id"] == "tinyrun" and forked.attempts[0]["parent"]["step"] == 6
    # the parent runledger.init(fork_from="tinyrun?_step=6") records: the same point, the same checkpoint
    assert forked.attempts[0]["parent"] == fork_point(root, "tinyrun", 6)
    assert _count(root, "select min(step) from steps where run_id = 'tinyfork' and from_run = 'tinyfork'") == 7
    # its steps are spliced: the parent's up to the checkpoint it forked from, its own after
    assert _count(root, "select string_agg(from_run || ':' || step, ',' order by step) from steps where run_id = 'tinyfork'") \
        == ",".join([f"tinyrun:{k}" for k in range(1, 7)] + [f"tinyfork:{k}" for k in range(7, 10)])
    assert forked.status == "completed" and forked.step == 9
    assert ledger_process.terminate() == 0
