"""`runledger agents` (the contingency agents on the live stream, re-forecasting plans their decisions change) and `runledger decide RUN` (a person's
decision, recorded like an agent's)."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import signal
import uuid

from runledger.tools import checks
from runledger.tools.args import RUN_HELP, UsageError, add_nats, add_root, resolve_nats, server_of

log = logging.getLogger(__name__)


def register(sub) -> None:
    s = sub.add_parser("agents", help="the contingency agents, on the live stream")
    add_root(s)
    add_nats(s)
    s.add_argument("--run-id", type=checks.run_id, default=None, help="watch only this run")
    s.set_defaults(func=cmd_agents)

    s = sub.add_parser("decide", help="a person's decision, recorded like an agent's")
    s.add_argument("run", type=checks.run, help=RUN_HELP)
    add_root(s)
    add_nats(s)
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--approve", metavar="DECISION_ID", type=checks.line, help="approve a proposed decision")
    g.add_argument("--reject", metavar="DECISION_ID", type=checks.line, help="reject a proposed decision")
    g.add_argument("--action", type=checks.line, help="a decision of your own, e.g. set_token_horizon")
    g.add_argument("--ack", metavar="ALERT_ID", type=checks.line,
                   help="acknowledge an alert: an alert_ack event (`runledger notify` stops repeating its page)")
    s.add_argument("--param", action="append", type=checks.line, default=[], metavar="K=V", help="the action's parameters (JSON values)")
    s.add_argument("--reason", default=None, help="why (required with --action; with --ack, its note)")
    s.add_argument("--by", type=checks.line, default=None, help="who decides (default: the login name)")
    s.set_defaults(func=cmd_decide)


def cmd_agents(args: argparse.Namespace) -> int:
    import asyncio  # (here: the parser that imports this module serves `runledger sql` too, which runs no loop)

    from runledger.agents.runner import run_agents
    from runledger.training.reforecast import revisions  # the ladder's forecast again when a decision changes the plan

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run_agents(args.root, server_of(args), args.run_id, stop, revise=revisions)

    asyncio.run(main())
    return 0


def acknowledge_alert(args: argparse.Namespace) -> int:
    """`decide RUN --ack ALERT_ID`: the person takes the page (an alert_ack from producer `cli`)."""
    from pydantic import ValidationError

    from runledger.ledger.decisions import acknowledge

    try:
        ack = acknowledge.acknowledgement(args.ack, args.by or getpass.getuser(), "cli", args.reason)
    except (ValidationError, acknowledge.AckRefused) as err:
        raise UsageError(f"not a valid acknowledgement: {str(err).splitlines()[0]}") from None
    if not acknowledge.record(args.root, resolve_nats(args), args.run, ack, "cli"):
        log.error("the acknowledgement is spooled but NATS has not acknowledged it yet; it will be sent next time")
        return 1
    print(f"acknowledged {args.ack} of {args.run} as {ack.by}")
    return 0


def decision_made(args: argparse.Namespace):
    """The person's decision as a typed `DecisionMade`; a malformed one is a UsageError."""
    from pydantic import ValidationError

    from runledger.ledger.decisions import review
    from runledger.ledger.contract.events import DecisionMade

    person = f"person:{args.by or getpass.getuser()}"
    if args.approve or args.reject:  # the review the dashboard's buttons make too
        try:
            return review.review(args.approve or args.reject, bool(args.approve), args.by or getpass.getuser(),
                                 args.reason, strict=False)
        except (ValidationError, review.ReviewRefused) as err:
            raise UsageError(f"not a valid review: {str(err).splitlines()[0]}") from None
    else:
        if not args.reason:
            raise UsageError("--action needs --reason: a decision without a reason is not auditable")
        params = {}
        for kv in args.param:
            k, sep, v = kv.partition("=")
            if not sep:
                raise UsageError(f"--param {kv!r} is not K=V")
            try:
                params[k] = json.loads(v)
            except json.JSONDecodeError:
                params[k] = v
        fields = dict(decision_id=f"{person}:{uuid.uuid4().hex[:12]}", agent=person, rule="manual",
                      action=args.action, params=params, rationale=args.reason, evidence={})
    try:
        return DecisionMade(**fields, mode="auto")
    except ValidationError as err:
        e = err.errors()[0]
        raise UsageError(f"not a valid decision: {'.'.join(map(str, e['loc'])) or 'decision'}: {e['msg']}") from None


def cmd_decide(args: argparse.Namespace) -> int:
    from runledger.ledger.decisions import review
    from runledger.ledger.contract.validation import check_name

    check_name(args.run, "run_id")
    if args.ack:
        return acknowledge_alert(args)
    decision = decision_made(args)
    try:  # (the path the dashboard's approve and reject take too)
        acked = review.record(args.root, resolve_nats(args), args.run, decision, producer="cli")
    except review.ReviewRefused as err:
        raise UsageError(str(err)) from None
    if not acked:
        log.error("the decision is spooled but NATS has not acknowledged it yet; it will be sent next time")
        return 1
    print(decision.decision_id)
    return 0
