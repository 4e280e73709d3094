"""What every `runledger` subcommand shares: the `--root` / `--nats` / `--creds` options (their
defaults from `runledger.ledger.settings`, their values checked by `runledger.tools.checks`), `UsageError`, which ends a
command with exit 2 and a one-line reason, and the warning for a secret given on the command line.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys

from runledger.ledger import redact, settings
from runledger.tools import checks


class UsageError(Exception):
    """Bad usage or bad input: exit 2 with this one-line reason."""


# every command's RUN argument (dest "run"): the main entry resolves a name to its run's id, once
# (`runledger.tools.cli.resolve_run_arg`), before the command runs
RUN_HELP = "the run: its id, or its name where one run has it"


def add_root(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", type=checks.folder, default=settings.root(),
                   help=f"ledger root directory (env {settings.ROOT_ENV})")


def add_nats(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nats", type=checks.nats_url, default=None,
                   help=f"NATS URL(s), comma-separated for a cluster (env {settings.NATS_ENV}; "
                   "default: the server `nats up` started for --root; a password belongs in --creds, not here)")
    p.add_argument("--creds", type=checks.file_in, default=None,
                   help=f"credentials file from `nats up --secure` (env {settings.CREDS_ENV})")


def resolve_nats(args: argparse.Namespace) -> str:
    """The server this command talks to (see `runledger.ledger.settings.nats_url`)."""
    try:
        url = settings.nats_url(getattr(args, "nats", None), getattr(args, "creds", None), getattr(args, "root", None))
    except OSError as err:  # $RUNLEDGER_CREDS names a file that is not there, say
        raise UsageError(f"cannot read the credentials file: {err}") from None
    try:
        return checks.nats_url(url)
    except checks.Bad as err:
        raise UsageError(f"the server URL from the settings: {err}") from None


def server_of(args: argparse.Namespace):
    """What a long-running command (notify, agents) follows: a function naming the server each time it is
    called. The server the flags or the environment name, else the root's: its embedded server stops
    when idle and may come back on another port, so it is looked up each time (None while none runs;
    nats://127.0.0.1:4222 while the root has never had one)."""
    if getattr(args, "nats", None) or getattr(args, "creds", None) or os.environ.get(settings.NATS_ENV) \
            or os.environ.get(settings.CREDS_ENV):
        url = resolve_nats(args)
        return lambda: url
    from runledger.ledger.bus import natsserver

    root = getattr(args, "root", None) or settings.root()
    return lambda: natsserver.running_url(root) or (None if settings.nats_dir(root).exists() else settings.DEFAULT_NATS_URL)


# options whose value may hold a secret, and where the secret belongs instead
SECRET_OPTIONS = {"nats": ("--nats", "--creds FILE"), "catalog": ("--catalog", "--catalog-file FILE")}


# options (and environment) naming a file that holds a secret
SECRET_FILES = {"creds": "--creds", "catalog_file": "--catalog-file", "token_file": "--token-file"}


def warn_secrets(args: argparse.Namespace) -> None:
    """One line on stderr for each option given a URL with a password (every local user can read a
    process's command line, /proc/PID/cmdline), and for each file of secrets other users can read."""
    for dest, (flag, instead) in SECRET_OPTIONS.items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and redact.redact(value) != value:
            print(f"runledger {args.command}: warning: {flag} holds a password, which every local user can read in "
                  f"the process list; give it in a file only you can read ({instead}, mode 0600)", file=sys.stderr)
    files = {flag: getattr(args, dest, None) for dest, flag in SECRET_FILES.items()}
    if hasattr(args, "creds") and not args.creds:
        files[f"${settings.CREDS_ENV}"] = os.environ.get(settings.CREDS_ENV)
    for flag, path in files.items():
        try:
            loose = bool(path) and stat.S_IMODE(os.stat(path).st_mode) & 0o077
        except OSError:
            continue
        if loose:
            print(f"runledger {args.command}: warning: {flag} {path} is readable by other users: "
                  f"`chmod 600 {path}`", file=sys.stderr)


def producer_keys(path: str | None) -> set[str] | None:
    """The trusted user keys of `--producer-keys FILE` (verifier keys, one a line), or None."""
    if path is None:
        return None
    from runledger.ledger.check.signed import read_trusted
    from runledger.ledger.tlog.note import NoteError

    try:
        return read_trusted(path)
    except (OSError, NoteError) as err:
        raise UsageError(f"cannot read the producer keys {path}: {err}") from None


def attestations(paths: list[str] | None):
    """The check of stored checkpoint attestations (verify, tlog audit: `runledger.ledger.attest.check_stored`)
    with the public keys of `--attest-key F` (PEM, each the signer's attest.pub), else the local key's."""
    import functools

    from runledger.ledger import attest

    try:
        keys = attest.read_public(paths) if paths else None
    except (OSError, ValueError) as err:
        raise UsageError(f"cannot read the attestation key: {err}") from None
    return functools.partial(attest.check_stored, keys=keys)


def add_signed_args(s: argparse.ArgumentParser) -> None:
    """--require-signed and --producer-keys: the chain heads (verify, tlog audit)."""
    s.add_argument("--require-signed", action="store_true",
                   help="a chain without a signed chain head (written before heads, imported, `runledger publish`'s) "
                        "is a problem; without it, such chains are counted as unsigned")
    s.add_argument("--producer-keys", metavar="FILE", type=checks.line, default=None,
                   help="the user keys (verifier keys, one a line) that may vouch for chain heads; without it, "
                        "any, and their keys are named")
    s.add_argument("--attest-key", metavar="F", type=checks.line, action="append", default=None,
                   help="a public key (PEM, the signer's attest.pub) that checkpoint attestations are checked with "
                        "(repeatable; default: the local key's, `runledger attest key`)")
