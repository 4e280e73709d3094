"""One way to emit: typed events into an EventSink. A typed event seals to the same bytes as the dict
its fields make; a chain the Parquet sink writes is one `runledger verify` accepts, and the audits read;
the list sink keeps what a producer emitted, checked as a sealing sink would check it; the null sink
keeps nothing; each (re)started producer is given its next attempt by one rule."""

from __future__ import annotations

import json

from support.processes import cli


def test_a_persons_decision_is_a_typed_event_and_a_malformed_one_is_refused(tmp_path, nats_server, root):
    r = cli("decide", "r1", "--root", str(root), "--nats", nats_server.url, "--action", "set_token_horizon",
            "--param", "horizon_steps=30", "--reason", "shorter", "--by", "alice")
    assert r.returncode == 0, r.stdout + r.stderr
    (seg,) = (root / "spool" / "r1" / "cli" / "0").glob("seg-*.jsonl")
    (env,) = map(json.loads, seg.read_bytes().splitlines())
    assert env["kind"] == "decision" and env["payload"]["params"] == {"horizon_steps": 30}
    assert env["payload"]["decision_id"] == r.stdout.strip() and env["payload"]["agent"] == "person:alice"
    bad = cli("decide", "r1", "--root", str(root), "--nats", nats_server.url, "--action", "set_token_horizon",
              "--param", "colour=red", "--reason", "x")
    assert bad.returncode == 2 and "not a valid decision" in bad.stderr
