"""`runledger notify --routes FILE`: deliver alerts and decisions to webhooks (runledger.interop.notify), until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import signal

from runledger.tools.args import UsageError, add_nats, add_root, server_of


def register(sub) -> None:
    s = sub.add_parser("notify", help="deliver alerts and decisions to webhooks (Slack or JSON), at least once")
    s.add_argument("--routes", required=True, metavar="FILE",
                   help="routes file (TOML [[route]] tables, or .json): url, format slack|json, and what each takes")
    s.add_argument("--name", default=None,
                   help="a name for this notify: its own durable consumer notify-NAME (default: the consumer notify)")
    s.add_argument("--from-start", action="store_true",
                   help="a new consumer delivers every alert and decision recorded so far (default: from now on)")
    add_root(s)
    add_nats(s)
    s.set_defaults(func=cmd_notify)


def cmd_notify(args: argparse.Namespace) -> int:
    import asyncio

    from runledger.interop.notify import DURABLE, serve
    from runledger.interop.routes import RoutesError, load_routes
    from runledger.ledger.contract.events import InvalidEvent
    from runledger.ledger.contract.validation import check_name

    try:
        routes = load_routes(args.routes)
        durable = DURABLE if args.name is None else f"{DURABLE}-{check_name(args.name, 'name')}"
    except (RoutesError, InvalidEvent) as err:
        raise UsageError(f"{args.routes if isinstance(err, RoutesError) else '--name'}: {err}") from None

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(routes, server_of(args), durable, args.from_start, stop)

    asyncio.run(main())
    return 0
