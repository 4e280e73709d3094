"""Attacks on the dashboard (`runledger ui`, issue 33): each test acts as the attacker (another server on
the same host that receives the browser's cookies, a hostile page on another local origin, a client
opening streams or sending hostile input, another local user reading the process list) and asserts
the promise, not the one input that once broke it.

- No secret reaches a cookie (a cookie goes to every port of the host), and cookies alone decide nothing.
- Every read needs a header a cross-origin page cannot send (an <img> tag's GET is refused).
- A query's answer is bounded in rows and bytes before it leaves DuckDB (API and `runledger sql`).
- Live streams are capped, and the streams watching a run share one query per wake.
- No token goes into a child's argv or environment; `--token` on a command line is warned about.
- Every route refuses missing, malformed and hostile input with a 4xx and one line, never a 500.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from starlette.testclient import TestClient

from support import REPO
from support.audit_ledger import T0, Ledger
from support.processes import cli, free_port

TOKEN = "write-token-0123456789abcdef"
HUGE_QUERY = "select range from range(20000000)"  # 20 million rows
GROWTH_MB = 600  # a generous bound on what one bounded answer may add to a process's memory
WATCHDOG_S = 120


def write_small_root(root: Path) -> Path:
    led = Ledger(root)
    led.emit("spiky", "run_started", {"config": {"lr": 1e-3}, "config_hash": "0" * 64}, 0, T0)
    for k in range(1, 21):
        led.emit("spiky", "step", {"loss": 3.0 - k * 1e-2, "grad_norm": 1.0, "lr": 1e-3, "tokens": 10, "step_time_s": 1.0},
                 k, T0 + timedelta(seconds=k))
    led.write()
    return root


@pytest.fixture
def two_runs_root(tmp_path) -> Path:
    return write_small_root(tmp_path / "root")


class Dashboard:
    """The real `runledger ui` in a child process, on loopback (no NATS behind it)."""

    def __init__(self, tmp: Path, root: Path, *args: str):
        self.port = free_port()
        self.log = open(tmp / "ui.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runledger.tools.cli", "ui", "--root", str(root), "--nats", "nats://127.0.0.1:1",
             "--port", str(self.port), *args], cwd=REPO, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.url = self.proc.stdout.readline().strip()  # the address, once it listens
        assert self.url.startswith("http://"), (tmp / "ui.log").read_text()

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
                timeout: float = WATCHDOG_S) -> tuple[int, dict, bytes]:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            c.request(method, path, body=body, headers={"host": f"127.0.0.1:{self.port}", **(headers or {})})
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()} | {"set-cookie": r.headers.get_all("set-cookie") or []}, r.read()
        finally:
            c.close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.proc.stdout.close()
        self.log.close()


@pytest.fixture
def token_file(tmp_path) -> Path:
    f = tmp_path / "ui-token.json"
    f.write_text(json.dumps({"token": TOKEN}))
    f.chmod(0o600)
    return f


@pytest.fixture
def dashboard(tmp_path, two_runs_root, token_file):
    d = Dashboard(tmp_path, two_runs_root, "--token-file", str(token_file))
    yield d
    d.stop()


@pytest.fixture
def open_dashboard(tmp_path, two_runs_root):
    """Loopback with no token given: reads need none (a write token is made and printed)."""
    d = Dashboard(tmp_path, two_runs_root)
    yield d
    d.stop()


class Peak:
    """The largest RSS a process reaches while the block runs (sampled; the bound asserted is generous)."""

    def __init__(self, pid: int):
        self.proc, self.peak, self.done = psutil.Process(pid), 0, threading.Event()
        self.start = self.proc.memory_info().rss

    def _sample(self) -> None:
        while not self.done.wait(0.02):
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return

    def __enter__(self):
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.start) / 2**20


DECISION = json.dumps({"run": "spiky", "decision_id": "agent:x:1", "action": "approve", "by": "mallory"}).encode()


# ---------------------------------------------------------------- 2: the write token in a cookie
@pytest.mark.slow
def test_no_secret_goes_into_a_cookie_and_the_old_cookies_approve_nothing(dashboard):
    # the first visit with the token: nothing is set that another port of this host would receive
    status, headers, _ = dashboard.request("GET", f"/?token={TOKEN}")
    assert status == 200 and headers["set-cookie"] == [], headers["set-cookie"]
    # another server on 127.0.0.1 received the cookies an earlier version set: they let it do nothing
    stolen = {"cookie": f"rl_token={TOKEN}; rl_csrf=stolen-csrf-value", "x-csrf-token": "stolen-csrf-value"}
    status, _, body = dashboard.request("POST", "/api/decide", DECISION, {**stolen, "content-type": "application/json"})
    assert status in (401, 403), (status, body)
    status, _, _ = dashboard.request("GET", "/api/runs", headers={"cookie": f"rl_token={TOKEN}"})
    assert status in (401, 403)
    # a cross-origin simple POST (a form on another port of this host) is refused
    for origin in (f"http://127.0.0.1:{dashboard.port + 1}", "null"):
        status, _, body = dashboard.request("POST", "/api/decide", b"run=spiky&decision_id=x&action=approve&by=m", {
            **stolen, "content-type": "application/x-www-form-urlencoded", "origin": origin})
        assert status in (401, 403), (origin, status, body)
    # ... while the token in its header opens the API (the page sends it on every request)
    status, _, body = dashboard.request("GET", "/api/status", headers={"x-runledger-token": TOKEN})
    assert status == 200 and json.loads(body)["can_decide"] is True


# ---------------------------------------------------------------- 7: reads and their bounds
@pytest.mark.slow
def test_a_hostile_local_page_reads_nothing_even_from_an_open_loopback_dashboard(open_dashboard):
    d = open_dashboard
    # what <img src=http://127.0.0.1:8765/api/sql?q=...> sends: a plain GET, no custom header
    for path in ("/api/sql?q=select%201", "/api/runs", "/api/run/spiky", "/api/live", "/api/status"):
        for extra in ({}, {"origin": "http://127.0.0.1:8888", "sec-fetch-site": "same-site", "sec-fetch-dest": "image"}):
            status, _, _ = d.request("GET", path, headers=extra, timeout=15)
            assert status in (401, 403), (path, extra, status)
    # the page (and a script) sends a header a cross-origin page cannot set without a preflight
    status, _, body = d.request("GET", "/api/sql?q=select%2042%20as%20x", headers={"x-requested-with": "runledger"})
    assert status == 200 and json.loads(body)["rows"] == [[42]]


@pytest.mark.slow
def test_a_huge_query_through_the_dashboard_is_bounded_in_rows_and_memory(dashboard):
    with Peak(dashboard.proc.pid) as peak:
        status, _, body = dashboard.request("GET", "/api/sql?q=" + HUGE_QUERY.replace(" ", "%20"),
                                            headers={"x-runledger-token": TOKEN})
    got = json.loads(body)
    assert status == 200 and got["truncated"] is True and len(got["rows"]) <= 10_000, {k: v for k, v in got.items() if k != "rows"}
    assert got["rows"][:3] == [[0], [1], [2]]
    assert peak.growth_mb < GROWTH_MB, f"the dashboard grew by {peak.growth_mb:.0f} MB"


@pytest.mark.slow
def test_a_huge_query_through_runledger_sql_is_bounded_and_says_so(two_runs_root):
    proc = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "sql", "--root", str(two_runs_root), "--format", "csv",
                             HUGE_QUERY], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with Peak(proc.pid) as peak:
        out, err = proc.communicate(timeout=WATCHDOG_S)
    assert proc.returncode == 0, err[-2000:]
    lines = out.splitlines()
    assert lines[:3] == ["range", "0", "1"] and len(lines) - 1 <= 1_000_000
    assert "truncated at" in err and "--max-rows" in err, err[-500:]
    assert peak.peak / 2**20 < GROWTH_MB + 200, f"runledger sql reached {peak.peak / 2**20:.0f} MB"
    few = cli("sql", "--root", str(two_runs_root), "--format", "csv", "--max-rows", "5", HUGE_QUERY)
    assert few.returncode == 0 and few.stdout.splitlines() == ["range", "0", "1", "2", "3", "4"]
    assert "truncated at 5 rows" in few.stderr
    bad = cli("sql", "--root", str(two_runs_root), "--max-rows", "-1", "select 1")
    assert bad.returncode == 2 and "--max-rows" in bad.stderr


def test_a_wide_answer_is_bounded_in_bytes_too(two_runs_root):
    from runledger import queries

    con = queries.connect(two_runs_root)
    try:
        cols, rows = queries.fetch_bounded(con, "select repeat('x', 100000) as s from range(1000)", 30,
                                           max_rows=1000, max_bytes=1_000_000)
    finally:
        con.close()
    assert cols == ["s"] and 1 <= len(rows) <= 11 and rows.truncated


@pytest.mark.slow
def test_live_streams_beyond_the_cap_are_refused(dashboard):
    from runledger.ui.streams import MAX_STREAMS

    for query in ("run=..", "run=A", "run=" + "x" * 300, "since=abc", "since=-1", "since=nan", "since=1e999",
                  "since=99999999999999999999999"):  # (a stream that is not refused never ends: the watchdog fails it)
        status, _, body = dashboard.request("GET", f"/api/live?{query}", headers={"x-runledger-token": TOKEN}, timeout=15)
        assert status == 400 and len(body.splitlines()) == 1, (query, status, body)
    socks, statuses = [], []
    try:
        for _ in range(300):
            s = socket.create_connection(("127.0.0.1", dashboard.port), timeout=15)
            s.sendall(f"GET /api/live?run=spiky HTTP/1.1\r\nhost: 127.0.0.1:{dashboard.port}\r\n"
                      f"x-runledger-token: {TOKEN}\r\n\r\n".encode())
            statuses.append(int(s.recv(64).split(b" ", 2)[1]))
            socks.append(s)
        assert statuses.count(200) == MAX_STREAMS and statuses.count(429) == 300 - MAX_STREAMS, statuses
        for s in socks[:5]:  # streams that close give their places back
            s.close()
        deadline = time.monotonic() + 15
        while True:
            status, _, _ = dashboard.request("GET", "/api/status", headers={"x-runledger-token": TOKEN})
            probe = socket.create_connection(("127.0.0.1", dashboard.port), timeout=15)
            probe.sendall(f"GET /api/live HTTP/1.1\r\nhost: 127.0.0.1:{dashboard.port}\r\n"
                          f"x-runledger-token: {TOKEN}\r\n\r\n".encode())
            code = int(probe.recv(64).split(b" ", 2)[1])
            socks.append(probe)
            if code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert code == 200
    finally:
        for s in socks:
            s.close()


async def until_stored(sub) -> list[dict]:
    """A stream's events up to its next `stored` (the end of one wake)."""
    events = []
    while not events or events[-1]["event"] != "stored":
        event = await sub.next(10.0)
        assert event is not None, events
        events.append(event)
    return events


def test_the_streams_watching_a_run_share_one_query_per_wake(two_runs_root):
    """Eight pages watching one run: the ledger stores a step, the feed wakes once, and the run's new
    points are read once and reach all eight."""
    from runledger.ledger.storage import positions
    from runledger.ui.data import Reader
    from runledger.ui.live import Feed
    from runledger.ui.streams import Streams

    positions.write_position(two_runs_root, 21)
    reader = Reader(two_runs_root, threads=1)
    calls = []
    real = reader.new_points
    reader.new_points = lambda *a, **k: calls.append(a) or real(*a, **k)

    async def watch() -> list[list[dict]]:
        feed = Feed(reader, None)
        streams = Streams(reader, feed)
        subs = [streams.open("spiky", 21) for _ in range(8)]
        for sub in subs:
            await sub.next(0.5)  # the status event (and any catch-up)
        caught_up = len(calls)
        led = Ledger(two_runs_root)
        led.stream_seqs = iter(range(22, 100))
        led.emit("spiky", "step", {"loss": 1.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 10, "step_time_s": 1.0},
                 21, T0 + timedelta(seconds=21))
        led.write()
        positions.write_position(two_runs_root, 22)
        await feed.moved()
        got = [await until_stored(sub) for sub in subs]
        for sub in subs:
            sub.close()
        assert streams.open_count == 0
        return got, len(calls) - caught_up

    try:
        got, queries_per_wake = asyncio.run(watch())
    finally:
        reader.close()
    assert queries_per_wake == 1
    for events in got:
        points = [e["data"] for e in events if e["event"] == "points"]
        assert len(points) == 1 and points[0]["step"]["loss"] == {"0": ([21], [1.0])}


# ---------------------------------------------------------------- 3: no token in a child's argv or environment
@pytest.mark.slow
def test_the_demos_dashboard_gets_its_token_from_a_private_file_not_its_argv(tmp_path, nats_server):
    from rich.console import Console

    from runledger.tools.demo import QUICK, Demo, start_ui

    root = tmp_path / "demo-root"
    (root / "logs").mkdir(parents=True)
    write_small_root(root)
    demo = Demo(root, QUICK, Console(file=open(os.devnull, "w")))
    demo.nats = nats_server
    try:
        url = start_ui(demo)
        token = url.split("?token=", 1)[1]
        proc = demo.procs[-1]
        argv = " ".join(map(str, proc.args))
        assert token not in argv
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode(errors="replace")
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().decode(errors="replace")
        assert token not in cmdline and token not in environ
        [given] = [a for a in proc.args if str(a).endswith(".json") and "token" in str(a)]
        assert stat.S_IMODE(os.stat(given).st_mode) == 0o600 and token in Path(given).read_text()
        port = int(url.split(":")[2].split("/")[0])
        deadline = time.monotonic() + 60
        while True:  # the token of the URL opens the dashboard
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                c.request("GET", "/api/status", headers={"x-runledger-token": token})
                status, body = (r := c.getresponse()).status, r.read()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, (root / "logs" / "ui.log").read_text()
                time.sleep(0.2)
        assert status == 200 and json.loads(body)["can_decide"] is True
    finally:
        demo.nats = None
        demo.stop()


def test_a_token_given_on_the_command_line_is_warned_about():
    r = cli("ui", "--token", TOKEN, "--port", "70000")
    warned = [line for line in r.stderr.splitlines() if "--token-file" in line]
    assert len(warned) == 1 and "process list" in warned[0], r.stderr


# ---------------------------------------------------------------- 19: every route validates its input
def sweep_requests() -> list[tuple[str, str, dict]]:
    """(method, path, kwargs) of missing, malformed and hostile input for every route."""
    bad_runs = ["..", "a.b", "A", "x" * 300, "%00", "sp%20iky", "-x", "%2e%2e%2fetc"]
    bad_numbers = ["abc", "1e999", "nan", "inf", "-inf", "-1", "99999999999999999999999", ""]
    out = []
    for run in bad_runs:
        out += [("GET", f"/api/run/{run}", {}), ("GET", f"/api/run/{run}/series?source=step&keys=loss", {}),
                ("GET", f"/api/run/{run}/audit/health", {}), ("GET", f"/api/health?runs={run}", {}),
                ("GET", f"/api/compare?runs=spiky,{run}", {}), ("GET", f"/api/run/{run}/config", {})]
    for n in bad_numbers:
        out += [("GET", f"/api/run/spiky/series?source=step&keys=loss&px={n}", {}),
                ("GET", f"/api/run/spiky/series?source=step&keys=loss&x0={n}&x1=5", {}),
                ("GET", f"/api/run/spiky/series?source=drops&x1={n}", {}),
                ("GET", f"/api/compare?runs=spiky&px={n}", {})]
    out += [("GET", "/api/run/spiky/series?source=nope&keys=loss", {}), ("GET", "/api/run/spiky/series?source=step&keys=nope", {}),
            ("GET", "/api/run/spiky/series?source=step&keys=" + ",".join(["loss"] * 5000), {}),
            *[("GET", f"/api/run/spiky/series?source={src}&keys=loss&x={x}", {}) for src in ("step", "metrics", "drops")
              for x in ("nope", "metric:", "metric:loss%22%3B%20drop", "metric:%27)%20or%201%3D1--", "x" * 5000, "tokens")],
            ("GET", "/api/run/spiky/audit/nope", {}), ("GET", "/api/compare?source=nope", {}),
            ("GET", "/api/compare?runs=" + ",".join(f"r{i}" for i in range(1000)), {}),
            ("GET", "/api/health?runs=" + ",".join(f"r{i}" for i in range(1000)), {}),
            ("GET", "/api/ladder/" + "x" * 5000, {}), ("GET", "/api/ladder/%00", {}),
            ("GET", "/api/runs?config=%3D%3D%3D", {}), ("GET", "/api/runs?status=" + "x" * 5000, {}),
            ("GET", "/api/runs?metrics=" + ",".join(f"m{i}" for i in range(1000)), {}), ("GET", "/api/runs?metrics=" + "x" * 5000, {}),
            ("GET", "/api/runs?metrics=loss%27)%3Bselect%201%3B--,%00,..%2F..", {}),
            ("GET", "/api/compare?runs=spiky&keys=" + ",".join(f"k{i}" for i in range(1000)), {}),
            ("GET", "/api/compare?runs=spiky&source=metrics&keys=" + "x" * 5000, {}),
            ("GET", "/api/compare?runs=spiky&source=step&keys=loss%27)%3Bselect%201%3B--", {}),
            ("GET", "/api/sql", {}), ("GET", "/api/sql?q=", {}), ("GET", "/api/sql?q=" + "x" * 20_000, {}),
            ("GET", "/api/sql?q=select%20*%20from%20read_text('/etc/passwd')", {}), ("GET", "/api/sql?q=attach%20'x'", {}),
            ("GET", "/api/nowhere", {}), ("GET", "/static/../../etc/passwd", {})]
    for body in [b"", b"not json", b"[]", b"[1,2]", b'"a string"', b"42", b"null", b"{", b"\xff\xfe",
                 b'{"run": 5, "decision_id": "x", "action": "approve", "by": "m"}',
                 b'{"run": "spiky", "decision_id": ["x"], "action": "approve", "by": "m"}',
                 b'{"run": "spiky", "decision_id": "x", "action": "approve", "by": {"a": 1}}',
                 b'{"run": "spiky", "decision_id": "x", "action": "approve", "by": "m", "reason": [1]}',
                 b'{"run": "spiky", "decision_id": "x", "action": "nope", "by": "m"}',
                 b'{"run": "spiky", "decision_id": "' + b"x" * 10_000 + b'", "action": "approve", "by": "m"}',
                 json.dumps({"run": "spiky", "decision_id": "x", "action": "approve", "by": "m", "pad": "x" * 100_000}).encode()]:
        out.append(("POST", "/api/decide", {"content": body, "headers": {"content-type": "application/json"}}))
    out.append(("POST", "/api/decide", {"content": b"{}", "headers": {"content-type": "text/plain"}}))
    return out


def test_every_route_refuses_hostile_input_with_a_4xx_and_one_line_never_a_500(two_runs_root):
    from runledger.ui.access import configure
    from runledger.ui.app import create_app

    app = create_app(two_runs_root, None, configure("127.0.0.1", token=TOKEN))
    with TestClient(app, base_url="http://127.0.0.1:8765", raise_server_exceptions=False,
                    headers={"x-runledger-token": TOKEN}) as c:
        for method, path, kwargs in sweep_requests():
            r = c.request(method, path, **kwargs)
            status, text = r.status_code, r.text
            assert status < 500, (method, path[:120], status, text[:300])
            if status >= 400 and path.startswith("/api/"):
                assert len(text.strip().splitlines()) == 1, (path[:120], text[:300])
        list_body = c.post("/api/decide", content=b"[]", headers={"content-type": "application/json"})
        assert list_body.status_code == 400 and "object" in list_body.json()["error"]
        huge = c.post("/api/decide", content=b"{" + b" " * 70_000 + b"}", headers={"content-type": "application/json"})
        assert huge.status_code == 413
