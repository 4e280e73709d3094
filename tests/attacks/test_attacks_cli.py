"""Attacks on what the ledger reads and what its readers print (issue 13, items 9-11 and 13-16).

Each test acts as the attacker (a producer with hostile JSON, a publisher of text meant for a
terminal, a reader of the server's secrets, a careless or hostile query, a broken root) and then
asserts the promise: what the contract allows is stored exactly, what it forbids is quarantined
with a one-line reason, stored text is printed as text, secrets stay out of SQL and logs, a query
is bounded, and bad input ends in one line and exit 2.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import nats
import pytest

from runledger import queries
from runledger.ledger.bus import jetstream as bus
from runledger.ledger.bus import natsserver
from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.contract.events import InvalidEvent, subject_for
from runledger.ledger.contract.parsing import parse_json
from runledger.ledger.contract.validation import check_envelope
from runledger.ledger.emit.sealing import seal, seal_many
from runledger.ledger.ingest.service import Ledger
from support import REPO
from support.processes import LedgerProcess, cli
from support.reading import reader, wait_for_count
from support.runs import (
    build_run,
    ledger_root,  # noqa: F401 (fixtures)
)

RUN = "atk"
HUGE = {"seed": 10**30, "negative": -(10**25), "past_u64": 2**64, "small": 7}  # integers JSON allows, past 64 bits
CROSS_JOIN = "select sum(a.range * b.range) from range(1000000) a, range(1000000) b"  # 10^12 rows: never ends
BIG_STRING = "select string_agg(repeat('x', 1000), '') from range(1000000)"  # a 1 GB string
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING) ")


def started(config: dict) -> dict:
    return {"config": config, "config_hash": "c0ffee", "token_budget": 1000, "schedule": {}}


def one_line_refusal(r: subprocess.CompletedProcess, command: str) -> str:
    """The refusal a command printed: exit 2 and one line (log lines aside), never a traceback."""
    lines = [line for line in r.stderr.splitlines() if not LOG_LINE.match(line)]
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and len(lines) == 1 and lines[0].startswith(f"runledger {command}:"), r.stderr
    return lines[0]


async def publish(url: str, messages: list[tuple[str, bytes]]) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await bus.ensure_stream(js)
    for subject, data in messages:
        await js.publish(subject, data)
    await nc.close()


# ---------------------------------------------------------------- 9-11: JSON the contract allows or forbids


def honest_messages() -> list[tuple[str, bytes]]:
    """A producer's events whose free-form config holds integers past 64 bits: one alone, two in a batch."""
    _, alone = seal(RUN, "worker-0", 0, 0, "run_started", started(HUGE), 0, "")
    _, _, texts = seal_many(RUN, "worker-1", 0, 0, "config",  # (one chain holds one run_started: these are config)
                            [{"config": HUGE}, {"config": {**HUGE, "small": 8}}], [0, 0], "")
    return [(subject_for(RUN, "run_started"), alone.encode()),
            (subject_for(RUN, "config"), b"[" + b",".join(texts) + b"]")]


def hostile_messages() -> list[tuple[str, bytes, str]]:
    """Correctly hashed events (as the ledger read them before) with text that RFC 8785 input cannot
    hold: (subject, data, what the quarantine reason must say)."""

    def text(producer: str, config: dict) -> str:
        return seal(RUN, producer, 0, 0, "run_started", started(config), 0, "")[1]

    subject = subject_for(RUN, "run_started")
    return [
        # orjson refuses 1e400, the standard library reads it as Infinity, and orjson wrote that back as null
        (subject, text("atk-inf", {"x": None}).replace('"x":null', '"x":1e400').encode(), "1e400"),
        (subject, text("atk-ninf", {"x": [None]}).replace('"x":[null]', '"x":[-1E+999]').encode(), "-1E+999"),
        # two values for one key: the ledger hashed the last one, a first-wins reader sees the other
        (subject, text("atk-dup", {"lr": 0.1}).replace('{"lr":0.1}', '{"lr":0.5,"lr":0.1}').encode(), "duplicate key 'lr'"),
        (subject, text("atk-dup2", {}).replace('{"attempt":0,', '{"attempt":3,"attempt":0,').encode(),
         "duplicate key 'attempt'"),
    ]


def test_json_the_contract_allows_is_stored_exactly_and_json_it_forbids_is_quarantined(root, nats_server, ledger_process):
    ledger_process.start()
    hostile = hostile_messages()
    asyncio.run(publish(nats_server.url, honest_messages() + [(s, d) for s, d, _ in hostile]))

    assert wait_for_count(root, "select count(*) from quarantine", len(hostile)) == len(hostile)
    assert wait_for_count(root, "select count(*) from events where kind in ('run_started', 'config')", 3) == 3
    assert ledger_process.proc.poll() is None, "the ledger stopped"
    con = reader(root)
    stored = con.execute("select producer, payload, config from (select producer, seq, payload, config from runs "
                         "union all select producer, seq, payload, config from config_updates) order by producer, seq"
                         ).fetchall()
    assert [p for p, _, _ in stored] == ["worker-0", "worker-1", "worker-1"]
    for _, payload, config in stored:  # the digits as sent, in the payload text and its typed column
        assert '"seed":1000000000000000000000000000000' in payload and '"past_u64":18446744073709551616' in payload
        assert json.loads(config)["seed"] == 10**30 and json.loads(config)["negative"] == -(10**25)
    assert stored[0][1] == canonical_json(started(HUGE))

    reasons = [r[0] for r in con.execute("select reason from quarantine order by stream_seq").fetchall()]
    for (_, _, expected), reason in zip(hostile, reasons):
        assert expected in reason and "\n" not in reason, (expected, reason)
    assert con.execute("select count(*) from events where producer like 'atk-%'").fetchone()[0] == 0
    verify = cli("verify", "--root", str(root))
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_the_ledgers_decoder_takes_what_the_contract_allows_and_refuses_what_parsers_disagree_on(tmp_path):
    """The same messages at unit level, through the ledger's own decode (plain batches included)."""
    ledger = Ledger(tmp_path / "root")
    honest = honest_messages()
    hostile = hostile_messages()
    messages = [(s, d, i + 1) for i, (s, d) in enumerate(honest + [(s, d) for s, d, _ in hostile])]
    decoded = ledger.decode(messages)
    taken = [(ev.env, ev.payload_text) for ev in decoded.events]
    taken += [(env, text) for envs, texts, _ in decoded.batches for env, text in zip(envs, texts)]
    assert sorted(env["event_id"] for env, _ in taken) == [f"{RUN}:worker-0:0:0", f"{RUN}:worker-1:0:0", f"{RUN}:worker-1:0:1"]
    for env, text in taken:
        assert env["payload"]["config"]["seed"] == 10**30 and type(env["payload"]["config"]["past_u64"]) is int
        assert text == canonical_json(env["payload"])
    assert len(decoded.rejected) == len(hostile)
    for (_, _, expected), q in zip(hostile, decoded.rejected):
        assert expected in q.reason, (expected, q.reason)

    for _, data, expected in hostile:  # and the contract's own parser, as a producer's `publish` uses it
        with pytest.raises(InvalidEvent, match=re.escape(expected)):
            check_envelope(parse_json(data))


def test_a_producer_cannot_seal_what_the_ledger_would_refuse():
    """NaN and Infinity in free-form JSON were sealed as null (orjson writes them so): refused at emit."""
    for config in ({"x": float("inf")}, {"x": [{"y": float("-inf")}]}, {"x": float("nan")}):
        with pytest.raises(InvalidEvent, match="NaN/Infinity"):
            seal(RUN, "worker-0", 0, 0, "run_started", started(config), 0, "")
        with pytest.raises(InvalidEvent, match="event 1 of 2: NaN/Infinity"):
            seal_many(RUN, "worker-0", 0, 0, "run_started", [started({}), started(config)], None, "")


# ---------------------------------------------------------------- 13: stored text is printed as text


def test_text_anyone_can_publish_is_printed_as_text_by_sql(root, nats_server, ledger_process):
    ledger_process.start()
    planted = "[/]\x1b[2J[bold red]OWNED[link=http://evil]x[/link]\x07\u202e"
    refused = json.dumps({"event_id": planted, "kind": "step"}).encode()  # quarantined, its event_id kept
    asyncio.run(publish(nats_server.url, [(subject_for(RUN, "step"), refused), ("runledger.[/].step", b"{}")]))
    assert wait_for_count(root, "select count(*) from quarantine", 2) == 2

    r = cli("sql", "--root", str(root), "select event_id from quarantine where event_id is not null")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout and "\u202e" not in r.stdout  # nothing reaches the terminal
    assert "[/]\\x1b[2J[bold red]OWNED[link=http://evil]x[/link]\\x07\\u202e" in r.stdout  # every character shown
    r = cli("sql", "--root", str(root), "select subject from quarantine")
    assert r.returncode == 0 and "runledger.[/].step" in r.stdout, r.stderr
    r = cli("sql", "--root", str(root), "select * from quarantine")  # whatever the reasons say
    assert r.returncode == 0 and "\x1b" not in r.stdout, r.stderr
    r = cli("sql", "--root", str(root), "select 1 as \"[/]\"")  # a column name is text too
    assert r.returncode == 0 and "[/]" in r.stdout, r.stderr


# ---------------------------------------------------------------- 14: secrets stay out of SQL and logs


HOOKED_CLI = r"""
import os, stat, sys
os.umask(0o022)  # the usual default: a file made without a mode is readable by all
seen = []
def watch(event, args):  # the modes of the server's files whenever this process touches them
    if event in ("os.chmod", "os.rename") and "/nats/" in os.fspath(args[0]):
        try:
            seen.append((event, os.fspath(args[0]), stat.S_IMODE(os.stat(args[0]).st_mode)))
        except OSError:
            pass
sys.addaudithook(watch)
from runledger.tools.cli import main
rc = main(sys.argv[1:])
for event, path, mode in seen:
    print("seen", event, oct(mode), path)
sys.exit(rc)
"""


@pytest.fixture
def secure_root(tmp_path):
    """`nats up --secure` (users per role, their passwords and credentials files), watched as it writes."""
    root = tmp_path / "root"
    r = subprocess.run([sys.executable, "-c", HOOKED_CLI, "nats", "up", "--secure", "--runs", "r1", "--root", str(root)],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    try:
        assert r.returncode == 0, r.stderr
        yield root, [line.split(" ", 3)[1:] for line in r.stdout.splitlines() if line.startswith("seen ")]
    finally:
        natsserver.down(root)


def passwords(root: Path) -> list[str]:
    return [u["password"] for u in json.loads((root / "nats" / "users.json").read_text()).values()]


def test_the_servers_secrets_are_private_from_the_moment_they_exist(secure_root):
    root, seen = secure_root
    assert seen, "the writes were not seen"
    for event, mode, path in seen:  # at every moment this process touched them, before any chmod
        assert int(mode, 8) & 0o077 == 0, f"{path} was {mode} at {event}"
    nats_dir = root / "nats"
    secrets = [nats_dir / "users.json", nats_dir / "nats-server.conf", *(nats_dir / "creds").glob("*.creds")]
    assert len(secrets) == 2 + 7  # users.json, the config, and ledger, agent, notify, reader, admin, relay, worker-r1
    for f in secrets:
        assert f.stat().st_mode & 0o777 == 0o600, f
    assert (nats_dir / "creds").stat().st_mode & 0o077 == 0


def test_sql_cannot_read_the_servers_passwords(secure_root):
    root, _ = secure_root
    build_run(root)
    nats_dir = (root / "nats").resolve()
    for query in (f"select content from read_text('{nats_dir}/users.json')",
                  f"select content from read_text('{nats_dir}/creds/ledger.creds')",
                  f"select content from read_text('{root.resolve()}/events/../nats/nats-server.conf')",
                  f"select * from glob('{nats_dir}/creds/*')"):
        r = cli("sql", "--root", str(root), "--format", "csv", query)
        assert not any(pw in r.stdout + r.stderr for pw in passwords(root)), query
        assert "ledger.creds" not in r.stdout, query
        one_line_refusal(r, "sql")
    r = cli("sql", "--root", str(root), "--format", "csv", "select count(*) as n from steps")  # the data: yes
    assert r.returncode == 0 and r.stdout.splitlines()[1] != "0", r.stderr


def test_the_ledgers_log_never_shows_a_password(secure_root, tmp_path):
    root, _ = secure_root
    creds = natsserver.read_creds(root / "nats" / "creds" / "ledger.creds")
    ledger = LedgerProcess(root, creds, tmp_path / "ledger.log").start()
    try:
        deadline = time.monotonic() + 60
        while "ledger serving" not in ledger.log_path.read_text() and time.monotonic() < deadline:
            assert ledger.proc.poll() is None, ledger.log_path.read_text()
            time.sleep(0.1)
        assert ledger.terminate() == 0
    finally:
        ledger.kill()
    log = ledger.log_path.read_text()
    assert "ledger serving" in log and "nats://ledger:***@127.0.0.1:" in log, log
    assert not any(pw in log for pw in passwords(root)), log


# ---------------------------------------------------------------- 15: a query is bounded in time and memory


def test_a_query_that_never_ends_is_stopped_at_its_time_limit(ledger_root):
    line = one_line_refusal(cli("sql", "--root", str(ledger_root), "--timeout", "1", CROSS_JOIN), "sql")
    assert "time limit of 1 s" in line


def test_a_query_that_wants_all_memory_is_stopped_at_its_limit(ledger_root):
    line = one_line_refusal(cli("sql", "--root", str(ledger_root), "--memory-limit", "64MB", BIG_STRING), "sql")
    assert "Out of Memory" in line


def test_a_console_connection_is_bounded_and_usable_after_a_stop(ledger_root):
    """What a UI console gets from queries: a connection with a memory limit, queries with a timeout."""
    con = queries.connect(ledger_root, memory_limit="64MB")
    with pytest.raises(queries.QueryTimeout):
        queries.fetch_bounded(con, CROSS_JOIN, 0.5)
    with pytest.raises(duckdb.OutOfMemoryException):
        queries.fetch_bounded(con, BIG_STRING, 30)
    assert queries.fetch_bounded(con, "select count(*) as n from steps", 30) == (["n"], [(10,)])
    with pytest.raises(ValueError, match="not a size"):
        queries.connect(ledger_root, memory_limit="plenty")


# ---------------------------------------------------------------- 16: bad input is one line and exit 2


def test_a_query_that_fails_while_running_is_one_line(ledger_root):
    for query in ("select cast('x' as integer)", "select error('planted')", "select 1/0 = cast('y' as int)"):
        line = one_line_refusal(cli("sql", "--root", str(ledger_root), query), "sql")
        assert line.startswith("runledger sql: SQL error:")


READERS = {
    "sql": ["sql", "select count(*) from events"],
    "verify": ["verify"],
    "replay": ["replay", "run-1"],
    "audit": ["audit", "health", "run-1"],
    "report": ["report", "run-1", "--out", "{tmp}/report.html"],
}


@pytest.mark.parametrize("command", sorted(READERS))
def test_a_reader_refuses_a_root_that_is_a_file_or_is_not_there(command, tmp_path):
    args = [a.format(tmp=tmp_path) for a in READERS[command]]
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("x")
    assert "not a folder" in one_line_refusal(cli(*args, "--root", str(a_file)), command)
    assert "no ledger at" in one_line_refusal(cli(*args, "--root", str(tmp_path / "typo")), command)
    assert not (tmp_path / "typo").exists() and not (tmp_path / "report.html").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every folder: no folder is unreadable to it")
def test_a_reader_refuses_a_root_it_cannot_read(ledger_root):
    ledger_root.chmod(0)
    try:
        for command in ("sql", "verify", "replay"):
            args = [a.format(tmp=ledger_root.parent) for a in READERS[command]]
            assert "not readable" in one_line_refusal(cli(*args, "--root", str(ledger_root)), command)
    finally:
        ledger_root.chmod(0o755)


def test_nats_up_refuses_a_port_that_does_not_exist(tmp_path):
    line = one_line_refusal(cli("nats", "up", "--root", str(tmp_path / "r"), "--port", "99999"), "nats")
    assert "99999" in line
    assert not (tmp_path / "r" / "nats" / "url").exists()


@pytest.mark.parametrize("command", ["replay", "audit", "report"])
def test_a_planted_file_that_is_not_parquet_is_one_line(ledger_root, command, tmp_path):
    planted = sorted((ledger_root / "events" / "kind=step").glob("*/*.parquet"))[0]
    planted.write_bytes(b"PAR1 this is not a Parquet file")
    args = [a.format(tmp=tmp_path) for a in READERS[command]]
    line = one_line_refusal(cli(*args, "--root", str(ledger_root)), command)
    assert planted.name in line


def test_a_report_of_a_run_that_is_not_there_is_refused(ledger_root, tmp_path):
    out = tmp_path / "report.html"
    line = one_line_refusal(cli("report", "no-such-run", "--root", str(ledger_root), "--out", str(out)), "report")
    assert "no events for run 'no-such-run'" in line
    assert not out.exists()
