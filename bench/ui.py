"""The dashboard at scale: 1,000 runs, one of them 1M steps x 20 free-form metrics, served by `runledger
ui`, with TensorBoard's scalars endpoint beside it, in one command:

    python -m bench.ui [--runs 1000] [--big-steps 1000000] [--metrics 20] [--peer-steps 100000] [--keep DIR] [--cold]

What is measured (each next to the machine's load, `uptime`):
- the runs page: the server's answer to /api/runs (cold: the UI's cache folder empty; then the median
  of 5; then after a restart of the UI, its cache folder kept), the health counts of its first page
  (100 rows, /api/health: worked out at start) and of its second (one pass when asked), and in Debian's
  chromium (selenium, headless) the first contentful paint and the time until the runs table is drawn
  (`window.rlTimings`, set by the page once the view is painted);
- the big run's page: the server's answer to its 20 series (one min/max pass, /api/run/big/series) and in
  chromium the time from the route to every chart drawn and painted;
- emit -> page: an Emitter logs a step of the big run (a real nats-server and `runledger ledger serve`
  on the same root); the time from `emit` returning to that point arriving at an SSE client of
  /api/live (the page's stream), 20 times; median and p90;
- the peer: TensorBoard (`tensorboard --logdir`) over the same metrics written as event files
  (`--peer-steps` steps, a smaller size, stated), its load time and its
  /data/plugin/scalars/scalars answer for each tag; whether the planted spike survives its sampling.

How the ledger is made: 999 small runs (run_started, 30 steps, run_finished) are sealed by the real
writer (`runledger.ledger.emit.sink.ParquetSink`, one commit); the big run's 1M metrics events are built as Arrow
tables in the writer's own schema (envelope columns, `payload` text and `metrics/NAME` columns) and
committed to the ledger's tables like the writer's files, with random 64-hex hashes chained through
prev_hash (not their content's SHA-256): `runledger verify` would reject them; the dashboard reads the
typed columns only. One spike (loss 50) is planted at 7/9 of the run (step 777,777 of 1M). The NATS stream is fast-forwarded
past the stored stream seqs (a purge to seq N+1) so the ledger process continues the same root.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from runledger.ledger.storage import digest, positions, store
from runledger.ledger.storage.files import partition_dir, write_atomic
from runledger.ledger.storage.rows import StoredEvent, arrow_schema
from runledger.ledger.emit.sink import ParquetSink

log = logging.getLogger("bench.ui")
REPO = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)
FILE_ROWS = 200_000  # big-run events per Parquet file (the ledger compacts into files of this order)
SPIKE, SPIKE_AT = 50.0, 7 / 9  # one loss spike, at this fraction of the big run (step 777,777 of 1M)
TOKEN = "bench-token-0123456789abcdef"
LEDGER_START_S = 600.0  # how long the ledger process may take to open a kept root and serve
EMITS = 20  # emit -> page samples
EMIT_WAIT_S = 30.0  # a point not on the stream this long after its emit is counted lost (and said so), not waited for
PAGE_ROWS = 100  # the runs page's rows drawn at a time (ui/static/app.js PAGE_ROWS): its health counts come in one request
GOAL_S = 1.0  # the goals: runs page, big run's page, emit -> page median; the big run's first chart
PANELS_GOAL_S = 3.0  # issue 37: every panel of the big run's page (charts, health checklist, provenance)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip().split("load average:")[-1].strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------ the ledger
def write_small_runs(root: Path, n: int, seqs) -> None:
    rows: list[StoredEvent] = []
    for i in range(n):
        sink = ParquetSink(root, f"run-{i:04d}", stream_seqs=seqs, rows=rows, flush_every=None)
        at = T0 + timedelta(minutes=i)
        sink.emit_dict("run_started", {"config": {"lr": 1e-3 * (1 + i % 5), "layers": 2 + i % 3, "seed": i},
                                       "config_hash": f"{i:064x}", "tags": ["bench", f"group-{i % 10}"],
                                       "project": "bench"}, 0, at)
        sink.emit_dicts("step", [{"loss": 4.0 - 0.01 * k, "grad_norm": 1.0, "lr": 1e-3, "tokens": 1000, "step_time_s": 1.0}
                                 for k in range(1, 31)], list(range(1, 31)), at)
        if i % 4:
            sink.emit_dict("run_finished", {"status": "completed", "final_step": 30}, 30, at)
    store.write_events(root, rows)


def metric_names(n: int) -> list[str]:
    base = ["train/loss", "train/grad_norm", "train/lr", "train/mfu", "train/tokens_per_s", "eval/loss"]
    return (base + [f"train/m{j:02d}" for j in range(n)])[:n]


def write_big_run(root: Path, run_id: str, steps: int, names: list[str], seq0: int) -> int:
    """The big run's metrics events as Arrow tables in the writer's schema; returns the next stream seq."""
    tables = store.tables_of(root)
    schema = arrow_schema("metrics")
    rng = np.random.default_rng(0)
    seq, prev = seq0, ""
    start = ParquetSink(root, run_id, "bench-meta", stream_seqs=itertools.count(seq), flush_every=None)
    start.emit_dict("run_started", {"config": {"lr": 3e-4, "layers": 24, "seed": 0}, "config_hash": "b" * 64,
                                    "tags": ["bench", "big"], "project": "bench"}, 0, T0)
    start.close()
    seq += 1
    written = []
    for first in range(0, steps, FILE_ROWS):
        m = min(FILE_ROWS, steps - first)
        step = np.arange(first + 1, first + m + 1, dtype=np.int64)
        seqs = np.arange(seq, seq + m, dtype=np.int64)
        ts = np.datetime64(T0.replace(tzinfo=None), "us") + (step * 500_000).astype("timedelta64[us]")
        ts_arr = pa.array(ts, pa.timestamp("us", tz="UTC"))
        hexes = os.urandom(32 * m).hex()
        hashes = [hexes[i * 64:(i + 1) * 64] for i in range(m)]
        values = {}
        for j, name in enumerate(names):
            v = 2.0 + 8.0 / np.sqrt(step) + j + rng.normal(0, 0.01, m)
            if name == "train/loss":
                v[step == int(steps * SPIKE_AT)] = SPIKE
            values[name] = v
        seq_s = pc.cast(pa.array(seqs), pa.string())
        payload = pc.binary_join_element_wise('{"metrics":{"train/loss":', pc.cast(pa.array(values[names[0]]), pa.string()),
                                              "}}", "")  # (the payload text of the first metric only: never read here)
        data = {
            "event_id": pc.binary_join_element_wise(f"{run_id}:worker-0:0:", seq_s, ""),
            "run_id": pa.array(np.full(m, run_id, dtype=object), pa.string()),
            "producer": pa.array(np.full(m, "worker-0", dtype=object), pa.string()),
            "attempt": np.zeros(m, dtype=np.int64), "seq": seqs - seq0 - 1, "kind": pa.array(np.full(m, "metrics", dtype=object), pa.string()),
            "time": pc.binary_join_element_wise(pc.strftime(ts_arr, format="%Y-%m-%dT%H:%M:%S"), "Z", ""), "ts": ts_arr,
            "step": step, "schema_version": np.ones(m, dtype=np.int64), "prev_hash": [prev] + hashes[:-1], "hash": hashes,
            "payload": payload, "stream_seq": seqs, "ingested_at": ts_arr, "nonfinite": pa.nulls(m, pa.map_(pa.string(), pa.string())),
            "text": pa.nulls(m, pa.map_(pa.string(), pa.string())),
        }
        fields = list(schema) + [pa.field(f"metrics/{n}", pa.float64()) for n in names]
        data.update({f"metrics/{n}": values[n] for n in names})
        table = pa.table([data[f.name] if isinstance(data[f.name], pa.Array) else pa.array(data[f.name], f.type)
                          for f in fields], schema=pa.schema(fields))
        path = partition_dir(root, "metrics", run_id) / f"part-{seq:012d}-{seq + m - 1:012d}-bench.parquet"
        write_atomic(tables.with_field_ids("metrics", digest.with_digest(table)), path, fast=True)
        written.append(path)
        seq, prev = seq + m, hashes[-1]
        log.info("big run: %d/%d steps", first + m, steps)
    tables.commit({"metrics": written})
    return seq


def write_peer(logdir: Path, steps: int, names: list[str]) -> None:
    """The same metrics (first `steps` steps, the spike moved inside them) as TensorBoard event files."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    w = EventFileWriter(str(logdir / "big"))
    spike = int(steps * SPIKE_AT)
    for k in range(1, steps + 1):
        vals = [summary_pb2.Summary.Value(tag=n, simple_value=(SPIKE if (n == "train/loss" and k == spike)
                                                               else 2.0 + 8.0 / k ** 0.5 + j)) for j, n in enumerate(names)]
        w.add_event(event_pb2.Event(wall_time=time.time(), step=k, summary=summary_pb2.Summary(value=vals)))
    w.close()


# ------------------------------------------------------------------------------------ measuring
def evict(folder: Path) -> int:
    """Ask the OS to drop these files' pages from its cache (posix_fadvise DONTNEED): a cold start's reads."""
    n = 0
    for path in folder.rglob("*.parquet"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n += 1
        finally:
            os.close(fd)
    return n


def get(port: int, path: str) -> tuple[float, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    t0 = time.perf_counter()
    c.request("GET", path, headers={"authorization": f"Bearer {TOKEN}"})
    body = c.getresponse().read()
    return time.perf_counter() - t0, body


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--no-first-run", "--window-size=1400,1000",
                f"--user-data-dir={tempfile.mkdtemp()}"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


# what a view still loads after it is drawn (the health checklists), waited for before the next
# measurement so that one page's work does not run into the next one's time
SETTLED = {"runs": "return [...document.querySelectorAll('.health')].every(c => /ok|\\?/.test(c.textContent))",
           "run": "return !!(window.rlPanels && window.rlPanels.health && window.rlPanels.provenance)"}
# what one load of a run's page cost (issue 37): its first chart drawn, every panel (charts, health checklist,
# provenance) filled, in ms from the navigation's start; the requests it made (series ones apart), the bytes
PANELS = """
    const api = performance.getEntriesByType('resource').filter(e => e.name.includes('/api/') && !e.name.includes('/api/live'));
    const p = window.rlPanels || {};
    return {first_chart_ms: window.rlFirstChart ?? null, health_ms: p.health ?? null, provenance_ms: p.provenance ?? null,
            every_panel_ms: Math.max(window.rlTimings.at, p.health ?? Infinity, p.provenance ?? Infinity),
            requests: api.length, series_requests: api.filter(e => e.name.includes('/series')).length,
            bytes: api.reduce((n, e) => n + (e.encodedBodySize || 0), 0)};"""


def page_time(driver, url: str, view: str, timeout: float = 600) -> dict:
    """Load `url` (a new document) and wait for the page's view to be painted: its timings."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    WebDriverWait(driver, timeout, poll_frequency=0.05).until(
        lambda d: d.execute_script("return document.body.dataset.ready === '1' && !!window.rlTimings"))
    timings = driver.execute_script("""
        const nav = performance.getEntriesByType('navigation')[0];
        const fcp = performance.getEntriesByName('first-contentful-paint')[0];
        return {view_ms: window.rlTimings.ms, ready_ms: window.rlTimings.at, fcp_ms: fcp ? fcp.startTime : null,
                dom_ms: nav ? nav.domContentLoadedEventEnd : null,
                charts: (window.rlCharts || []).length, points: (window.rlCharts || []).reduce((n, c) => n + c.points(), 0)};""")
    t0 = time.perf_counter()
    WebDriverWait(driver, timeout, poll_frequency=0.1).until(lambda d: d.execute_script(SETTLED[view]))
    timings["settled_after_s"] = round(time.perf_counter() - t0, 2)
    if view == "run":
        time.sleep(1.0)  # (a request made after the page settled, as a zoom handler's, is counted)
        timings.update(driver.execute_script(PANELS))
    return timings


def emit_to_page(port: int, nats_url: str, root: Path, run_id: str, since: int, first_step: int) -> list[float]:
    """The seconds from `emit` returning to the point arriving on an SSE stream of /api/live, EMITS times."""
    from runledger.ledger.emit.emitter import Emitter
    from runledger.ledger.contract.events import MetricsLogged

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", f"/api/live?run={run_id}&since={since}", headers={"authorization": f"Bearer {TOKEN}"})
    resp = conn.getresponse()
    em = Emitter(run_id, "bench-live", None, nats_url, root / "spool")  # (the next attempt: a kept ledger has earlier ones)
    out, event, lost = [], "", []
    try:
        resp.readline()  # the status event
        for i in range(EMITS):
            step = first_step + i
            em.emit(MetricsLogged(metrics={"train/loss": 2.0}), step=step)
            t0 = time.perf_counter()
            while True:
                if time.perf_counter() - t0 > EMIT_WAIT_S:
                    log.warning("emit -> page: step %d not on the stream after %.0f s: counted lost", step, EMIT_WAIT_S)
                    lost.append(step)
                    break
                line = resp.readline().decode()
                if line.startswith("data:") and "points" in event and any(
                        step in xs for xs, _ in json.loads(line[5:]).get("metrics", {}).get("train/loss", {}).values()):
                    out.append(time.perf_counter() - t0)
                    break
                if line.startswith("event:"):
                    event = line
                elif not line.strip():
                    event = ""
            time.sleep(0.3)
    finally:
        em.close(timeout=10)
        conn.close()
    return out


def tensorboard_peer(logdir: Path, names: list[str]) -> dict:
    port = free_port()
    t0 = time.perf_counter()
    tb = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--port", str(port),
                           "--host", "127.0.0.1", "--load_fast", "false", "--reload_interval", "1"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        loaded = None
        while time.perf_counter() - t0 < 600:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                c.request("GET", "/data/plugin/scalars/tags")
                tags = json.loads(c.getresponse().read() or b"{}")
                if len(tags.get("big", {})) == len(names):
                    loaded = time.perf_counter() - t0
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.5)
        times, points, spike = [], 0, False
        t_all = time.perf_counter()
        for n in names:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            t1 = time.perf_counter()
            c.request("GET", f"/data/plugin/scalars/scalars?run=big&tag={n}")
            rows = json.loads(c.getresponse().read())
            times.append(time.perf_counter() - t1)
            points += len(rows)
            spike |= n == "train/loss" and any(r[2] == SPIKE for r in rows)
        return {"load_s": loaded, "per_tag_median_s": statistics.median(times), "all_tags_s": time.perf_counter() - t_all,
                "points": points, "spike_kept": spike}
    finally:
        tb.terminate()
        tb.wait(30)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--big-steps", type=int, default=1_000_000)
    p.add_argument("--metrics", type=int, default=20)
    p.add_argument("--peer-steps", type=int, default=100_000, help="TensorBoard's copy (0: no peer)")
    p.add_argument("--no-emit", action="store_true", help="no ledger process and no emit -> page measure (the pages only)")
    p.add_argument("--cold", action="store_true", help="drop the ledger's files from the OS page cache before the UI starts")
    p.add_argument("--keep", default=None, help="keep the ledger here (else a temp dir, removed); one kept there is reused")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    work = Path(args.keep or tempfile.mkdtemp(prefix="bench-ui-"))
    root = work / "ledger"
    names = metric_names(args.metrics)
    results: dict = {"runs": args.runs, "big_steps": args.big_steps, "metrics": len(names), "load_before": uptime()}
    procs: list[subprocess.Popen] = []
    from runledger.ledger.bus.natsserver import NatsServer

    nats = None
    try:
        t0 = time.perf_counter()
        if args.keep and (root / "catalog.db").exists():  # a ledger kept by an earlier run of this bench
            last = positions.read_position(root) or positions.taken_upto(root)
            results["write_s"] = "reused"
        else:
            seqs = itertools.count(1)
            write_small_runs(root, args.runs - 1, seqs)
            last = write_big_run(root, "big", args.big_steps, names, next(seqs)) - 1
            results["write_s"] = round(time.perf_counter() - t0, 1)
        log.info("ledger: written in %s s (stream seqs up to %d)", results["write_s"], last)

        nats = NatsServer(work / "nats").start()
        import asyncio

        from runledger.ledger.bus import jetstream as bus
        from runledger.ledger.contract.events import STREAM

        async def fast_forward():
            nc = await bus.connect(nats.url)
            js = nc.jetstream()
            await bus.ensure_stream(js)
            await js.purge_stream(STREAM, seq=last + 1)  # the stream goes on after the stored seqs
            await nc.close()

        asyncio.run(fast_forward())
        positions.write_position(root, last)
        logs = open(work / "procs.log", "ab")
        logged = (work / "procs.log").stat().st_size
        if not args.no_emit:
            procs.append(subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "ledger", "serve", "--root", str(root),
                                           "--nats", nats.url], cwd=REPO, stdout=logs, stderr=subprocess.STDOUT))
        t_serve = time.perf_counter()  # the UI is measured once the ledger serves (its start-up is not the UI's cold time)
        while not args.no_emit and f"ledger serving {root}".encode() not in (work / "procs.log").read_bytes()[logged:]:
            if procs[-1].poll() is not None or time.perf_counter() - t_serve > LEDGER_START_S:
                raise RuntimeError(f"the ledger did not start serving in {LEDGER_START_S:.0f} s: see {work / 'procs.log'}")
            time.sleep(0.2)
        results["ledger_start_s"] = round(time.perf_counter() - t_serve, 1)
        cache = work / "cache"  # the UI's cache folder (XDG_CACHE_HOME): empty at the first start, kept for the restart
        shutil.rmtree(cache, ignore_errors=True)

        def start_ui() -> subprocess.Popen:
            ui = subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "ui", "--root", str(root), "--nats", nats.url,
                                   "--port", str(port), "--token", TOKEN], cwd=REPO, stdout=subprocess.PIPE,
                                  stderr=logs, text=True, env={**os.environ, "XDG_CACHE_HOME": str(cache)})
            ui.stdout.readline()  # listening
            return ui

        port = free_port()
        if args.cold:  # the ledger's files out of the page cache: the first start reads them from the disk
            results["evicted_files"] = evict(root / "events")
        procs.append(start_ui())
        cold, body = get(port, "/api/runs")  # (the first answer waits for the rows summarised at start)
        listed = len(json.loads(body)["runs"])
        warm = statistics.median(get(port, "/api/runs")[0] for _ in range(5))
        newest = ",".join(r["run_id"] for r in json.loads(body)["runs"][:PAGE_ROWS])
        health_first, body = get(port, f"/api/health?runs={newest}")  # (worked out at start, or waited for)
        health_counted = len(json.loads(body)["health"])
        older = ",".join(r["run_id"] for r in json.loads(get(port, "/api/runs")[1])["runs"][PAGE_ROWS:2 * PAGE_ROWS])
        health_next, _ = get(port, f"/api/health?runs={older}")  # the second page: counted when asked, in one pass
        ui = procs.pop()  # a restart: the files' parts are kept in the cache folder, so only new files are read
        ui.terminate()
        ui.wait(30)
        procs.append(start_ui())
        restart, body = get(port, "/api/runs")
        relisted = len(json.loads(body)["runs"])
        keys = ",".join(names)
        series_cold, body = get(port, f"/api/run/big/series?source=metrics&keys={keys}&px=600")
        pts = sum(len(xs) for k in json.loads(body)["keys"].values() for xs, _ in k.values())
        series_warm = statistics.median(get(port, f"/api/run/big/series?source=metrics&keys={keys}&px=600")[0] for _ in range(3))
        spike = SPIKE in json.loads(body)["keys"]["train/loss"]["0"][1]
        results["server"] = {"runs_api_cold_s": round(cold, 3), "runs_api_median_s": round(warm, 3), "runs_listed": listed,
                             "runs_api_after_restart_s": round(restart, 3), "runs_listed_after_restart": relisted,
                             "health_first_page_s": round(health_first, 3), "health_runs_counted": health_counted,
                             "health_second_page_s": round(health_next, 3),
                             "big_series_cold_s": round(series_cold, 3), "big_series_median_s": round(series_warm, 3),
                             "big_series_points": pts, "spike_kept": spike, "load": uptime()}
        log.info("server: %s", results["server"])

        driver = browser()
        try:
            base = f"http://127.0.0.1:{port}"
            driver.get(f"{base}/?token={TOKEN}")  # the cookie, once
            runs_page = [page_time(driver, f"{base}/?r={i}#/", "runs") for i in range(3)]
            big_page = [page_time(driver, f"{base}/?r={i}#/run/big", "run") for i in range(3)]
            ui = procs.pop()  # a restart once the panels were worked out: they come from the cache folder
            ui.terminate()
            ui.wait(30)
            procs.append(start_ui())
            big_restart = page_time(driver, f"{base}/?r=restart#/run/big", "run")
        finally:
            driver.quit()
        med = lambda xs, k: round(statistics.median(x[k] for x in xs) / 1000, 3)  # noqa: E731
        results["browser"] = {"runs_page_fcp_s": med(runs_page, "fcp_ms"), "runs_page_drawn_s": med(runs_page, "ready_ms"),
                              "big_run_view_s": med(big_page, "view_ms"), "big_run_drawn_s": med(big_page, "ready_ms"),
                              "big_run_charts": big_page[0]["charts"], "big_run_points": big_page[0]["points"],
                              "first_loads": {"runs_page": runs_page[0], "big_run": big_page[0]},
                              "big_run_loads": big_page, "big_run_after_restart": big_restart,
                              "big_run_first_chart_s": med(big_page, "first_chart_ms"), "big_run_every_panel_s": med(big_page, "every_panel_ms"),
                              "load": uptime()}
        log.info("browser: %s", results["browser"])

        lat = [] if args.no_emit else emit_to_page(port, nats.url, root, "big", last, args.big_steps + 1)
        results["emit_to_page"] = {"median_s": round(statistics.median(lat), 3) if lat else None,
                                   "p90_s": round(sorted(lat)[int(0.9 * (len(lat) - 1))], 3) if lat else None,
                                   "n": len(lat), "lost": EMITS - len(lat), "load": uptime()} if not args.no_emit else {
                                   "median_s": None, "skipped": "--no-emit"}
        log.info("emit -> page: %s", results["emit_to_page"])
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if nats is not None:
            nats.stop()

    if args.peer_steps:
        t0 = time.perf_counter()
        if not (work / "tb" / "big").exists():
            write_peer(work / "tb", args.peer_steps, names)
        peer = tensorboard_peer(work / "tb", names)
        results["tensorboard"] = {"steps": args.peer_steps, "write_s": round(time.perf_counter() - t0, 1),
                                  **{k: round(v, 3) if isinstance(v, float) else v for k, v in peer.items()}, "load": uptime()}
        log.info("tensorboard: %s", results["tensorboard"])
    b, e = results["browser"], results["emit_to_page"]
    results["goals"] = {"runs_page_le_1s": b["runs_page_drawn_s"] <= GOAL_S, "big_run_page_le_1s": b["big_run_view_s"] <= GOAL_S,
                        "emit_to_page_median_le_1s": e["median_s"] is not None and e["median_s"] <= GOAL_S,
                        "big_run_first_chart_le_1s": b["big_run_first_chart_s"] <= GOAL_S,
                        "big_run_every_panel_le_3s": b["big_run_every_panel_s"] <= PANELS_GOAL_S}
    print(json.dumps(results, indent=1))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
