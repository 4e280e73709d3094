"""`runledger tlog audit` of a root's log, and `runledger verify` of the root, in this process (the exit code and
what it printed), with the log key the tests' ledgers sign with: the attacks on the log, its timestamps, its chain
heads and its attestations share them."""

from __future__ import annotations

from pathlib import Path


def tlog_audit(root: Path, capsys, *flags: str) -> tuple[int, str]:
    from runledger.ledger.tlog import log as tlog
    from runledger.ledger.tlog import note
    from runledger.tools.cli import main

    capsys.readouterr()
    vkey = note.read_key(tlog.key_file()).verifier.text()
    rc = main(["tlog", "audit", "--log", str(Path(root) / "tlog"), "--vkey", vkey, "--events", str(root), *flags])
    return rc, capsys.readouterr().out


def verify_root(root: Path, capsys, *flags: str) -> tuple[int, str]:
    from runledger.tools.cli import main

    capsys.readouterr()
    rc = main(["verify", "--root", str(root), *flags])
    return rc, capsys.readouterr().out
