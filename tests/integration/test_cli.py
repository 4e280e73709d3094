"""The `runledger` command as a user runs it: read-only SQL, publish, a local NATS server, replay errors.

In this process (`cli`) unless the process is what is tested (`runledger`): a server left running,
bytes on stdin, what a command's start-up imports."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

from runledger.ledger.emit.sealing import seal
from support import REPO
from support.processes import cli, runledger
from support.reading import reader, wait_for_count
from support.runs import ledger_root  # noqa: F401 (fixtures)


def test_a_query_gets_the_views_it_names_and_those_they_build_on(ledger_root):
    """`runledger sql` defines only what its query can reach (the audit helpers are slow to define):
    each view of views.sql, asked for alone, is there with everything below it."""
    from runledger import queries

    views = re.findall(r"^create or replace view (\w+)", queries.render_views(ledger_root), re.MULTILINE)
    assert {"events", "steps", "steps_all", "step_cells", "quarantine"} <= set(views)
    for name in views:
        cols, rows = queries.query(ledger_root, f"select count(*) from {name}")
        assert rows and rows[0][0] >= 0, name
    con = queries.connect(ledger_root, uses="select step from steps")
    defined = {r[0] for r in con.execute("select view_name from duckdb_views() where not internal").fetchall()}
    assert defined == {"steps", "steps_all", "step_events", "metric_events", "metrics_wide", "metrics_checked",
                       "fork_reads", "forks", "runs"}  # (steps splices a fork's parent: fork_reads, over forks and runs)


def test_publish_reports_bad_lines_and_publishes_every_valid_one(ledger_process, root):
    lines, prev, valid_ids = [], "", []
    for step in range(5):
        env, text = seal("pub-run", "worker-0", 0, step, "step",
                         {"loss": 2.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 100, "step_time_s": 0.1}, step, prev)
        prev = env["hash"]
        lines.append(text)
        valid_ids.append(env["event_id"])
    tampered = json.loads(lines[1]) | {"hash": "0" * 64, "seq": 9, "event_id": "pub-run:worker-0:0:9"}
    bad = {
        2: "this is not json",
        4: json.dumps(tampered),
        5: lines[0].replace('"pub-run', '"../x'),
        7: lines[2].replace('"loss":2', '"loss":NaN'),
        9: lines[3].replace('"tokens":100', '"tokens":100,"colour":"red"'),
    }
    text_in = []
    valid_iter = iter(lines)
    for lineno in range(1, 12):
        if lineno in bad:
            text_in.append(bad[lineno])
        elif lineno == 6:
            text_in.append("")  # a blank line is skipped but still counted
        else:
            text_in.append(next(valid_iter))
    assert next(valid_iter, None) is None

    r = cli("publish", "--nats", ledger_process.nats_url, input="\n".join(text_in) + "\n")
    assert r.returncode == 2, r.stderr
    reported = {int(line.split(":")[0].removeprefix("line ")): line for line in r.stderr.splitlines()
                if line.startswith("line ")}
    assert set(reported) == set(bad), r.stderr
    assert "not JSON" in reported[2] and "hash mismatch" in reported[4] and "'../x'" in reported[5]
    assert "NaN" in reported[7] and "colour" in reported[9]

    ledger_process.start()
    n = wait_for_count(root, "select count(*) from steps where run_id = 'pub-run'", len(valid_ids), timeout=60)
    assert n == len(valid_ids)

    stored = sorted(r[0] for r in reader(root).execute("select event_id from steps").fetchall())
    assert stored == sorted(valid_ids)
    assert reader(root).execute("select count(*) from quarantine").fetchone() == (0,)
    assert ledger_process.terminate() == 0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_nats_up_prints_the_url_and_down_stops_it(tmp_path):
    root = tmp_path / "r"
    pid = None
    try:
        r = runledger("nats", "up", "--root", str(root), timeout=60)
        assert r.returncode == 0, r.stderr
        url = r.stdout.strip().splitlines()[-1]
        assert url.startswith("nats://127.0.0.1:")
        pid = int((root / "nats" / "nats-server.pid").read_text())
        assert pid_alive(pid)

        again = runledger("nats", "up", "--root", str(root), timeout=60)  # already up: same server
        assert again.stdout.strip().splitlines()[-1] == url
        assert int((root / "nats" / "nats-server.pid").read_text()) == pid

        r = runledger("nats", "down", "--root", str(root), timeout=60)
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(pid)
        assert runledger("nats", "down", "--root", str(root)).returncode == 0  # nothing to stop: fine
    finally:
        if pid and pid_alive(pid):
            os.kill(pid, 9)


def test_sql_starts_without_jax_numpy_or_nats(ledger_root, tmp_path):
    """`runledger sql` loads DuckDB and the CLI, nothing of training, Arrow or NATS (once the view columns
    are in the cache, which the first run fills), no asyncio (it runs no loop) and, its table drawn to a pipe
    in plain ASCII, no rich."""
    heavy = ("jax", "numpy", "nats", "pydantic", "pyarrow", "scipy", "orbax", "asyncio", "rich")
    code = ("import sys; from runledger.tools.cli import main; rc = main(sys.argv[1:]); "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules), file=sys.stderr); sys.exit(rc)")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    for run in ("first", "cached"):
        r = subprocess.run([sys.executable, "-c", code, "sql", "--root", str(ledger_root), "select count(*) from steps"],
                           capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
        assert r.returncode == 0 and "10" in r.stdout, r.stderr
    assert r.stderr.splitlines()[-1] == "[]", r.stderr


def test_publish_reports_a_line_that_is_not_utf8_by_its_number():
    r = subprocess.run([sys.executable, "-m", "runledger.tools.cli", "publish", "--nats", "nats://127.0.0.1:9"],
                       input=b'{"loss": "\xff\xfe"}\n\nnot json\n', capture_output=True, cwd=REPO, timeout=60)
    err = r.stderr.decode()
    assert r.returncode == 2, err
    assert "line 1: not JSON: 'utf-8' codec can't decode" in err and "line 3: not JSON" in err, err
    assert "Traceback" not in err
