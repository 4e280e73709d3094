"""`runledger import tensorboard|mlflow|wandb SRC` and `runledger lineage RUN`: thin entry points into interop/."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from runledger.ledger import settings
from runledger.tools import checks
from runledger.tools.args import RUN_HELP, UsageError, add_nats, add_root

log = logging.getLogger("runledger")


def cmd_import(args: argparse.Namespace) -> int:
    from runledger.interop.importers import ImportRefused, SourceError, read_source
    from runledger.interop.importers.bring import bring
    from runledger.ledger.storage import locks
    from runledger.ledger.contract.validation import check_name

    if args.run_id is not None:
        check_name(args.run_id, "run_id")
    try:
        run = read_source(args.source, args.src, args.source_run)
    except SourceError as err:
        raise UsageError(str(err)) from None
    except ImportError as err:
        raise UsageError(f"reading {args.source} needs its library ({err.name}): pip install 'runledger[import]'") from None
    remote = args.nats or args.creds or os.environ.get(settings.NATS_ENV) or os.environ.get(settings.CREDS_ENV)
    nats = settings.nats_url(args.nats, args.creds, args.root) if remote else None
    try:
        done = bring(run, args.root, nats, args.run_id)
    except (ImportRefused, locks.Busy) as err:  # Busy: another import of the same run is under way
        raise UsageError(str(err)) from None
    print(done.line())
    return 0 if done.confirmed else 1


def cmd_lineage(args: argparse.Namespace) -> int:
    from runledger.interop import lineage
    from runledger.ledger.contract.validation import check_name

    check_name(args.run, "run_id")
    try:
        events = lineage.events_of(args.root, args.run, namespace=args.namespace)
    except lineage.NoRun as err:
        raise UsageError(str(err)) from None
    if args.to and args.to.startswith(("http://", "https://")):
        try:
            lineage.post(events, args.to)
        except Exception as err:  # the receiver refused or is down (after the transport's retries)
            log.error("could not post the OpenLineage events to %s: %s", args.to, str(err).splitlines()[0] if str(err) else
                      type(err).__name__)
            return 1
        log.info("posted %d OpenLineage events to %s", len(events), args.to)
    elif args.to:
        with open(args.to, "w") as f:
            f.writelines(line + "\n" for line in lineage.json_lines(events))
        log.info("wrote %d OpenLineage events to %s", len(events), args.to)
    else:
        sys.stdout.writelines(line + "\n" for line in lineage.json_lines(events))
    return 0


def register(sub) -> None:
    s = sub.add_parser("import", help="bring a TensorBoard, MLflow or W&B run's history in, exactly and idempotently")
    s.add_argument("source", choices=["tensorboard", "mlflow", "wandb"])
    s.add_argument("src", metavar="DIR_OR_URI",
                   help="tensorboard: the run's log folder; mlflow: a tracking URI (sqlite:///f.db, file:///mlruns, "
                        "http://...), a store folder or a run's folder in it; wandb: an offline run folder, its "
                        ".wandb file, or a wandb/ folder")
    s.add_argument("--run-id", default=None, help="the ledger's run id (default: one made from the source's run id)")
    s.add_argument("--source-run", default=None, metavar="ID",
                   help="the source's run id, where DIR_OR_URI holds several runs (mlflow, wandb)")
    add_root(s)
    add_nats(s)
    s.set_defaults(func=cmd_import)

    s = sub.add_parser("lineage", help="OpenLineage events for a run: its start, each attempt, its completion or failure")
    s.add_argument("run", type=checks.run, help=RUN_HELP)
    add_root(s)
    s.add_argument("--to", default=None, metavar="FILE|URL",
                   help="write JSON lines to FILE, or post them to an OpenLineage endpoint URL (default: stdout)")
    s.add_argument("--namespace", default="runledger", help="the OpenLineage job namespace (default: runledger)")
    s.set_defaults(func=cmd_lineage)
