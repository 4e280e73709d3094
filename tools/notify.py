"""`runledger notify --routes FILE`: deliver alerts and decisions to webhooks (runledger.interop.notify), until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import signal

from runledger.tools.args import UsageError, add_nats, add_root, server_of


def register(sub) -> None:
    s = sub.add_parser("notify", help="deliver alerts and decisions to webhooks (Slack, JSON, ntfy, Pushover), at least once")
    s.add_argument("--routes", required=True, metavar="FILE",
                   help="routes file (TOML [[route]] tables, or .json): url, format slack|json|ntfy|pushover, what each "
                        "takes, and its paging rules (cooldown_s, digest_every_s, repeat_every_s)")
    s.add_argument("--name", default=None,
                   help="a name for this notify: its own durable consumer notify-NAME (default: the consumer notify)")
    s.add_argument("--from-start", action="store_true",
                   help="a new consumer delivers every alert and decision recorded so far (default: from now on)")
    s.add_argument("--ack-listen", default=None, metavar="HOST:PORT",
                   help="take acknowledgements of pages on POST http://HOST:PORT/ack (needs --ack-token-file)")
    s.add_argument("--ack-token-file", default=None, metavar="FILE",
                   help="a file holding the token every POST /ack must carry (Authorization: Bearer TOKEN)")
    add_root(s)
    add_nats(s)
    s.set_defaults(func=cmd_notify)


def cmd_notify(args: argparse.Namespace) -> int:
    import asyncio

    from runledger.interop.notify import DURABLE, serve
    from runledger.interop.routes import RoutesError, load_routes
    from runledger.ledger.contract.events import InvalidEvent
    from runledger.ledger.contract.validation import check_name

    from runledger.interop.ackhook import AckHookError, AckListener, parse_listen, read_token

    try:
        routes = load_routes(args.routes)
        durable = DURABLE if args.name is None else f"{DURABLE}-{check_name(args.name, 'name')}"
    except (RoutesError, InvalidEvent) as err:
        raise UsageError(f"{args.routes if isinstance(err, RoutesError) else '--name'}: {err}") from None
    listener = None
    if args.ack_listen or args.ack_token_file:
        if not (args.ack_listen and args.ack_token_file):
            raise UsageError("--ack-listen and --ack-token-file go together")
        try:
            host, port = parse_listen(args.ack_listen)
            listener = AckListener(host, port, read_token(args.ack_token_file), args.root, server_of(args))
        except (AckHookError, OSError) as err:
            raise UsageError(f"--ack-listen: {err}") from None

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(routes, server_of(args), durable, args.from_start, stop)

    if listener is not None:
        listener.start()
    try:
        asyncio.run(main())
    finally:
        if listener is not None:
            listener.stop()
    return 0
