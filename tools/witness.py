"""`runledger witness keygen|key|serve`: a C2SP tlog-witness (runledger.ledger.tlog.witness): make its
key (type 0x04, cosignature/v1), print its verifier key, and serve `add-checkpoint` for the logs whose
verifier keys it is given, until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from runledger.tools.args import UsageError
from runledger.tools.checks import int_in

log = logging.getLogger(__name__)


def cmd_keygen(args: argparse.Namespace) -> int:
    from runledger.ledger.tlog import cosignature, note

    path = Path(args.out)
    if path.exists():
        raise UsageError(f"{path} exists: a witness's key is made once (its verifier key: `runledger witness key`)")
    try:
        cosigner = cosignature.Cosigner.generate(args.name)
    except note.NoteError as err:
        raise UsageError(str(err)) from None
    note.write_key(path, cosigner)
    print(cosigner.verifier.text())
    print(f"witness key: {path} (0600; its verifier key above goes in the policy files that trust this witness)",
          file=sys.stderr)
    return 0


def _read_key(path: str):
    from runledger.ledger.tlog import cosignature, note

    if Path(path).exists() and not Path(path).is_file():
        raise UsageError(f"{path} is not a file (a witness key: `runledger witness keygen --name NAME --out F`)")
    try:
        return cosignature.read_key(path)
    except FileNotFoundError:
        raise UsageError(f"{path}: no key (make one: `runledger witness keygen --name NAME --out F`)") from None
    except note.NoteError as err:
        raise UsageError(str(err)) from None


def cmd_key(args: argparse.Namespace) -> int:
    print(_read_key(args.key).verifier.text())
    return 0


def log_keys(given: list[str]) -> list:
    """The log verifier keys of --log-key: each a vkey, or a file of them (one a line, # comments)."""
    from runledger.ledger.tlog import note

    vkeys: list[str] = []
    for g in given:
        if Path(g).is_file():
            vkeys += [ln.strip() for ln in Path(g).read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        else:
            vkeys.append(g)
    try:
        return [note.Verifier.parse(v) for v in vkeys]
    except note.NoteError as err:
        raise UsageError(f"--log-key: {err}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from runledger.ledger.storage.locks import Busy
    from runledger.ledger.tlog import witness
    from runledger.tools.ui import listen, serve_http

    cosigner = _read_key(args.key)
    logs = log_keys(args.log_key)
    try:
        w = witness.Witness(args.state, cosigner, logs)
    except Busy as err:
        raise UsageError(f"{args.state}: another witness serves this state folder ({err})") from None
    except OSError as err:
        raise UsageError(f"--state {args.state}: {err.strerror}") from None
    sock, port = listen(args.host, args.port, tries=1)

    def when_up(url: str) -> None:
        print(url, flush=True)  # (the submission prefix: a policy's witness URL)
        log.info("witness %s for %s; state in %s", cosigner.verifier.text(), ", ".join(v.name for v in logs), args.state)

    serve_http(witness.app(w), args.host, sock, port, when_up)
    return 0


def register(sub) -> None:
    t = sub.add_parser("witness", help="a C2SP tlog-witness: cosign checkpoints of the logs it knows")
    ws = t.add_subparsers(dest="witness_command", required=True)
    s = ws.add_parser("keygen", help="make a witness key (0600); print its verifier key")
    s.add_argument("--name", required=True, help="the witness's name (a schema-less URL: witness.example.org)")
    s.add_argument("--out", required=True, metavar="F", help="the key file to make")
    s.set_defaults(func=cmd_keygen)
    s = ws.add_parser("key", help="the verifier key (type 0x04 vkey) of a witness key")
    s.add_argument("--key", required=True, metavar="F")
    s.set_defaults(func=cmd_key)
    s = ws.add_parser("serve", help="serve POST /add-checkpoint (C2SP tlog-witness) until SIGTERM/SIGINT")
    s.add_argument("--port", type=int_in(0, 65535, "a TCP port"), required=True, help="port (0: one the OS picks)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    s.add_argument("--state", required=True, metavar="DIR",
                   help="where the latest cosigned checkpoint of each log is kept (never rolled back or forgotten)")
    s.add_argument("--key", required=True, metavar="F", help="the witness key (`runledger witness keygen`)")
    s.add_argument("--log-key", action="append", required=True, metavar="VKEY",
                   help="a log's verifier key (`runledger tlog key`), or a file of them; repeatable")
    s.set_defaults(func=cmd_serve)
