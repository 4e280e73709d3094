"""`runledger attest key|verify`: the checkpoint attestation key's public key, and the check of an attested
checkpoint folder, or of every checkpoint of a run (model signing's own verifier, the statement's subject,
its digest against the ledger's `attestation` event). Exit 1 names the first difference."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runledger.tools import checks
from runledger.tools.args import UsageError, add_root


def _attesting():
    from runledger.ledger import attest

    why = attest.unavailable()
    if why is not None:
        raise UsageError(f"checkpoint attestation needs the [attest] extra: {why}")
    return attest


def cmd_key(args: argparse.Namespace) -> int:
    attest = _attesting()
    path = Path(args.key) if args.key else attest.key_file()
    try:
        sys.stdout.write(attest.public_pem(path).decode())
    except FileNotFoundError:
        raise UsageError(f"{path}: no key (one is made when the first checkpoint is attested)") from None
    except ValueError as err:
        raise UsageError(f"{path}: {err}") from None
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    attest = _attesting()
    try:
        public = Path(args.public_key).read_bytes() if args.public_key else attest.public_pem(attest.key_file())
    except FileNotFoundError as err:
        raise UsageError(f"{err.filename}: no key (give --public-key F: the attest.pub of the key that signed)") from None
    if (args.checkpoint is None) == (args.run is None):
        raise UsageError("give a checkpoint folder or --run RUN (each checkpoint of the run), not both")
    if args.run is not None and args.no_ledger:
        raise UsageError("--run reads the run's checkpoints from the ledger: not with --no-ledger")
    try:
        if args.run is not None:
            for line in attest.verify_run(Path(args.root), args.run, public=public):
                print(line)
        else:
            print(attest.verify(args.checkpoint, public=public, root=None if args.no_ledger else Path(args.root)))
    except attest.AttestFailed as err:
        print(f"FAILED: {err}", file=sys.stderr)
        return 1
    return 0


def register(sub) -> None:
    a = sub.add_parser("attest", help="attested model checkpoints: the signing key's public key, and the check of one")
    s_ = a.add_subparsers(dest="attest_command", required=True)
    s = s_.add_parser("key", help="the public key (PEM) of the checkpoint attestation key")
    s.add_argument("--key", default=None, help="the key file (default $RUNLEDGER_ATTEST_KEY, else beside the tlog key)")
    s.set_defaults(func=cmd_key)
    s = s_.add_parser("verify", help="check a checkpoint folder: model signing's verifier, its statement, the ledger's event")
    s.add_argument("checkpoint", nargs="?", default=None,
                   help="the checkpoint folder (e.g. .../checkpoints/RUN/step_00000008)")
    s.add_argument("--run", type=checks.run_id, default=None, metavar="RUN",
                   help="instead: every checkpoint a `checkpoint` event of RUN names")
    s.add_argument("--public-key", default=None, metavar="F",
                   help="the signer's public key, PEM (default: the local key's)")
    s.add_argument("--no-ledger", action="store_true", help="do not match the statement to a ledger's event")
    add_root(s)
    s.set_defaults(func=cmd_verify)
