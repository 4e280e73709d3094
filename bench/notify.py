"""Delivery rate of `runledger notify` to a local webhook receiver, beside its floor, in one command:

    python -m bench.notify [--events 2000] [--routes 1 4]

N alerts are recorded on a local nats-server (one Emitter, batched as producers send them); a receiver
(http.server, threaded, on loopback) takes every POST with 200. The floor is one thread POSTing the
same N request bodies one after another with urllib, as a route does (new connection each): what a
sequential at-least-once sender could do on this machine. Then notify (runledger.interop.notify.serve, in this
process) delivers the N events from the stream to 1 route, and to several routes at once (each event
to each route, each route its own queue). Reported: events delivered per second, and the ratio to the floor.

With `--ledger-steps N` it also shows that a receiver that is down does not slow the ledger: the time a
ledger process (`runledger ledger serve`) takes to store N steps and N/100 alerts from one Emitter,
alone and then with `runledger notify` running against a route nobody listens on (fresh server and
root each time; the order alternates over `--repeats`), and their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from runledger.interop.notify import post, request_body, serve
from runledger.interop.routes import Route
from runledger.ledger.storage import positions
from runledger.ledger.emit.emitter import Emitter
from runledger.ledger.bus.natsserver import NatsServer, free_port
from runledger.ledger.emit.sealing import seal

log = logging.getLogger("bench.notify")


class Counting(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int) -> None:
        self.keys: dict[str, set[str]] = {}
        self.lock = threading.Lock()
        counting = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                with counting.lock:
                    counting.keys.setdefault(self.path, set()).add(self.headers["Idempotency-Key"])
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", port), Handler)

    def delivered(self, paths: list[str]) -> int:
        with self.lock:
            return sum(len(self.keys.get(p, ())) for p in paths)


def alert(i: int) -> dict:
    return {"alert_id": f"a{i}", "agent": "agent-bench", "rule": "bench", "severity": ("info", "warn", "fail")[i % 3],
            "message": f"bench alert {i}"}


def floor_rate(route: Route, n: int) -> float:
    prev, bodies = "", []
    for i in range(n):
        env, _ = seal("bench", "agent-bench", 0, i, "alert", alert(i), i, prev)
        prev = env["hash"]
        bodies.append((request_body(route, env), env["event_id"]))
    t = time.perf_counter()
    for body, eid in bodies:
        post(route, body, eid)
    return n / (time.perf_counter() - t)


def notify_rate(url: str, routes: list[Route], receiver: Counting, n: int) -> float:
    paths = [r.url.rsplit("/", 1)[1] for r in routes]
    paths = [f"/{p}" for p in paths]

    async def main() -> float:
        stop = asyncio.Event()
        ready = asyncio.Event()
        task = asyncio.create_task(serve(routes, url, durable=f"notify-bench{len(routes)}", from_start=True, stop=stop,
                                         ready=ready, poll_s=0.1))
        await ready.wait()
        t = time.perf_counter()
        while receiver.delivered(paths) < n * len(routes):
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - t
        stop.set()
        await task
        return n * len(routes) / elapsed

    return asyncio.run(main())


def cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ledger_seconds(steps: int, with_notify: bool) -> tuple[float, dict[str, float]]:
    """Seconds from the first emit until a ledger process has stored `steps` steps and steps/100 alerts, and
    the CPU seconds the server, the ledger and notify spent meanwhile."""
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        server = NatsServer(tmp / "nats").start()
        root = tmp / "root"
        procs = [subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "ledger", "serve", "--root", str(root),
                                   "--nats", server.url], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        try:
            if with_notify:
                routes = tmp / "routes.toml"
                routes.write_text(f'[[route]]\nname = "down"\nurl = "http://127.0.0.1:{free_port()}/"\n')
                procs.append(subprocess.Popen([sys.executable, "-m", "runledger.tools.cli", "notify", "--routes", str(routes),
                                               "--nats", server.url, "--from-start"],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            _wait_for_consumers(server.url, ["ledger", "notify"] if with_notify else ["ledger"])
            pids = {"nats": server.proc.pid, "ledger": procs[0].pid, **({"notify": procs[1].pid} if with_notify else {})}
            cpu0 = {k: cpu_s(pid) for k, pid in pids.items()}
            t = time.perf_counter()
            worker = Emitter("bench", "worker-0", 0, server.url, tmp / "spool")
            agent = Emitter("bench", "agent-bench", 0, server.url, tmp / "spool")
            step = {"loss": 2.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 64, "step_time_s": 0.1}
            for k in range(steps):
                worker.emit_dict("step", step, step=k)
                if k % 100 == 0:
                    agent.emit_dict("alert", alert(k), step=k)
            assert worker.close(timeout=120) and agent.close(timeout=120)
            last = _stream_last(server.url)  # every event is in the stream (acknowledged): the ledger's goal
            while positions.read_position(root) < last:
                time.sleep(0.02)
            return time.perf_counter() - t, {k: round(cpu_s(pid) - cpu0[k], 2) for k, pid in pids.items()}
        finally:
            for p in procs:
                p.terminate()
                p.wait(30)
            server.stop()


def _wait_for_consumers(url: str, names: list[str], timeout_s: float = 120.0) -> None:
    """Until each named consumer exists (its process has started and is fetching), and a second more."""

    async def wait() -> None:
        from nats.js.errors import NotFoundError

        from runledger.ledger.bus import jetstream as bus

        nc = await bus.connect(url)
        js = nc.jetstream()
        deadline = time.monotonic() + timeout_s
        for name in names:
            while True:
                try:
                    await js.consumer_info("RUNLEDGER", name)
                    break
                except NotFoundError:
                    assert time.monotonic() < deadline, f"consumer {name} never appeared"
                    await asyncio.sleep(0.1)
        await nc.close()

    asyncio.run(wait())
    time.sleep(1.0)  # (past its first fetch: the process is idle, waiting for messages)


def _stream_last(url: str) -> int:
    async def last() -> int:
        from runledger.ledger.bus import jetstream as bus

        nc = await bus.connect(url)
        info = await nc.jetstream().stream_info("RUNLEDGER")
        await nc.close()
        return info.state.last_seq

    return asyncio.run(last())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=2000)
    p.add_argument("--routes", type=int, nargs="+", default=[1, 4])
    p.add_argument("--ledger-steps", type=int, default=0, help="also time the ledger with notify's route down")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        receiver = Counting(free_port())
        threading.Thread(target=receiver.serve_forever, daemon=True).start()
        try:
            em = Emitter("bench", "agent-bench", 0, server.url, Path(tmp) / "spool")
            for i in range(args.events):
                em.emit_dict("alert", alert(i), step=i)
            assert em.close(timeout=60), "the alerts were not all acknowledged"
            base = f"http://127.0.0.1:{receiver.server_port}"
            floor = floor_rate(Route("floor", f"{base}/floor"), args.events)
            out = {"events": args.events, "load_before": os.getloadavg()[0], "floor_posts_per_s": round(floor)}
            for k in args.routes:
                routes = [Route(f"r{k}-{j}", f"{base}/r{k}-{j}", format="slack" if j % 2 else "json") for j in range(k)]
                rate = notify_rate(server.url, routes, receiver, args.events)
                out[f"notify_{k}_routes_deliveries_per_s"] = round(rate)
                out[f"notify_{k}_routes_vs_floor"] = round(rate / floor, 2)
        finally:
            receiver.shutdown()
            server.stop()
    if args.ledger_steps:
        alone, beside, cpu = [], [], {"alone": [], "with_notify": []}
        for i in range(args.repeats):
            for with_notify in ((False, True) if i % 2 == 0 else (True, False)):
                seconds, used = ledger_seconds(args.ledger_steps, with_notify)
                (beside if with_notify else alone).append(seconds)
                cpu["with_notify" if with_notify else "alone"].append(used)
        out["ledger_steps"] = args.ledger_steps
        out["ledger_alone_s"] = [round(x, 2) for x in alone]
        out["ledger_with_notify_route_down_s"] = [round(x, 2) for x in beside]
        out["ledger_with_notify_vs_alone"] = round(min(beside) / min(alone), 2)
        out["cpu_s_during"] = cpu
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
