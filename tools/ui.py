"""`runledger ui [--root DIR] [--host 127.0.0.1] [--port P]`: the live dashboard (ui/app.py) under uvicorn.
With no server named (`--nats`, `--creds`, $RUNLEDGER_NATS, $RUNLEDGER_CREDS) it follows the root's own
(the one its embedded default or `runledger nats up` recorded: `runledger.ui.live.root_server`), wherever it is
and whenever it runs."""

from __future__ import annotations

import argparse
import logging
import sys

from runledger.ledger import settings
from runledger.ledger.redact import redact
from runledger.tools import checks
from runledger.tools.args import UsageError, add_nats, add_root

log = logging.getLogger(__name__)
DEFAULT_PORT = settings.DASHBOARD_PORT
PORT_TRIES = 20  # a port taken: the next free one of this many


def register(sub) -> None:
    s = sub.add_parser("ui", help="the live dashboard (loopback; a token for any other address)")
    add_root(s)
    add_nats(s)
    s.add_argument("--host", type=checks.line, default="127.0.0.1", help="address to bind (default loopback; any other needs a token)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; if taken, the next free one; 0: any free one)")
    s.add_argument("--token", default=None, help="read-write token every request must carry (made up if not given; "
                                                 "prefer --token-file: a command line is readable by every local user)")
    s.add_argument("--read-token", default=None, help="a read-only token (cannot approve or reject; prefer --token-file)")
    s.add_argument("--token-file", type=checks.file_in, default=None,
                   help='JSON {"token": ..., "read_token": ...}: the tokens, kept out of the process list')
    s.set_defaults(func=cmd_ui)


def quiet_stop(server_class):
    """uvicorn's Server, stopped by SIGTERM or SIGINT as every long-running runledger command is: a graceful
    shutdown, then exit 0 (uvicorn's own handlers raise the signal again once shut down, so the process
    died of it: exit -15, or 130 by KeyboardInterrupt)."""
    import contextlib
    import signal

    class Server(server_class):
        @contextlib.contextmanager
        def capture_signals(self):
            def handle(signum, frame):
                if self.should_exit and signum == signal.SIGINT:
                    self.force_exit = True  # (a second Ctrl-C: stop waiting for open connections)
                self.should_exit = True

            previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def serve_http(app, host: str, sock, port: int, when_up) -> None:
    """Serve `app` with uvicorn on `sock` (bound by `listen` to `port`) until SIGTERM or SIGINT (`quiet_stop`);
    `when_up(url)` once it serves, url being http://HOST:PORT/ (an IPv6 host in brackets)."""
    import asyncio

    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    server = quiet_stop(uvicorn.Server)(config)

    async def serve():
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            when_up(f"http://{f'[{host}]' if ':' in host else host}:{port}/")
        await task

    asyncio.run(serve())


def listen(host: str, port: int, tries: int = PORT_TRIES):
    """A socket bound to `host` on `port`, or, where that is taken, on the next free one of the `tries`
    after it (port 0: one the OS picks); returns (socket, port). Bound here, not by uvicorn, so that no
    other process takes the port between looking and binding."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for p in range(port, port + tries) if port else [0]:
        if p > 65535:
            break
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # (named: asyncio sets TCP_NODELAY only then)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, p))
        except OSError as err:
            sock.close()
            if err.errno == errno.EADDRINUSE:
                continue
            raise UsageError(f"cannot listen on {host}:{p}: {err.strerror}") from None
        sock.listen(2048)
        sock.set_inheritable(True)
        return sock, sock.getsockname()[1]
    raise UsageError(f"ports {port} to {port + tries - 1} on {host} are all taken: pass --port")


def cmd_ui(args: argparse.Namespace) -> int:
    from runledger.ui.access import configure
    from runledger.ui.app import create_app
    from runledger.ui.live import root_server

    if args.token or args.read_token:  # (every local user can read a process's command line)
        log.warning("a token given with --token or --read-token is in the process list, readable by every local "
                    "user: prefer --token-file (a JSON file only you can read)")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a TCP port")
    try:
        access = configure(args.host, args.token, args.read_token, args.token_file)
    except (ValueError, OSError) as err:
        raise UsageError(str(err)) from None
    sock, port = listen(args.host, args.port)
    if port != args.port and args.port:  # (said first: a script reading the address from stdout still reads it first there)
        print(f"runledger ui: port {args.port} is taken; serving on {port} instead", file=sys.stderr, flush=True)
    try:  # a server named (flag or environment): that one, tried again while it does not answer; else the
        named = settings.named_nats(args.nats, args.creds)  # root's own, looked up at each (re)connect
    except OSError as err:  # ($RUNLEDGER_CREDS names a file that is not there, say)
        raise UsageError(f"cannot read the credentials file: {err}") from None
    server = named or root_server(args.root)
    app = create_app(args.root, server, access)

    def when_up(url: str) -> None:
        token = access.write_token if (args.token is None and access.open_reads) else None
        settings.record_dashboard(args.root, url)  # (for runledger.init's line: no token)
        print(url + (f"?token={token}" if token else ""), flush=True)
        log.info("runledger ui over %s (live updates from %s)%s", args.root,
                 redact(named) if named else "the root's NATS server, whenever one runs",
                 "" if token else "; open it with ?token=YOUR_TOKEN once")

    try:
        serve_http(app, args.host, sock, port, when_up)
    finally:
        settings.forget_dashboard(args.root)
    return 0
