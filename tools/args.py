"""What every `runledger` subcommand shares: the `--root` / `--nats` / `--creds` options (their
defaults from `ledger.settings`) and `UsageError`, which ends a command with exit 2 and a one-line reason.
"""

from __future__ import annotations

import argparse

from ledger import settings


class UsageError(Exception):
    """Bad usage or bad input: exit 2 with this one-line reason."""


def add_root(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default=settings.root(), help=f"ledger root directory (env {settings.ROOT_ENV})")


def add_nats(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nats", default=None, help=f"NATS URL(s), comma-separated for a cluster (env {settings.NATS_ENV}; "
                   "default: the server `nats up` started for --root)")
    p.add_argument("--creds", default=None,
                   help=f"credentials file from `nats up --secure` (env {settings.CREDS_ENV})")


def resolve_nats(args: argparse.Namespace) -> str:
    """The server this command talks to (see `ledger.settings.nats_url`)."""
    return settings.nats_url(getattr(args, "nats", None), getattr(args, "creds", None), getattr(args, "root", None))
