"""A reader written elsewhere checks our log (issue 47): tests/oracle/tlogcheck, a Go program built on the Go
checksum database's own code (golang.org/x/mod/sumdb/tlog and sumdb/note, where the C2SP formats come from),
reads the tiles and entry bundles the ledger wrote, verifies the checkpoints' signatures, rebuilds every hash
tile from the entries, and checks every leaf's inclusion, our `tlog prove` proofs and our `tlog consistency`
proofs; and it refuses a tampered tile, an edited bundle, a rewritten or truncated log and another key.
Skipped without `go` or Debian's golang-golang-x-mod-dev (`make oracle` installs them and runs this)."""

from __future__ import annotations

import base64
import functools
import http.server
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from runledger.ledger.ingest import service
from runledger.ledger.storage.reads import read_events
from runledger.ledger.tlog import checkpoint, note, tiles
from runledger.ledger.tlog import log as tlog
from runledger.tools.cli import main
from support.batches import batch_for

ORACLE_SRC = Path(__file__).resolve().parents[1] / "oracle" / "tlogcheck"
GOPATH = Path("/usr/share/gocode")  # Debian's golang-golang-x-mod-dev puts golang.org/x/mod here
X_MOD = GOPATH / "src" / "golang.org" / "x" / "mod" / "sumdb"
RUNS, PER_RUN = 4, 769  # 3,076 leaves: 12 full tiles and a partial one of 4, a partial level-1 tile of 12
SIGNED_AT = [1, 255, 256, 257, 1000, 2048, RUNS * PER_RUN]  # checkpoints on both sides of tile edges


@pytest.fixture(scope="module")
def oracle(tmp_path_factory) -> Path:
    go = shutil.which("go")
    if go is None:
        pytest.skip("no `go` on PATH: the Go oracle needs it (`make oracle` installs Debian's golang-go)")
    if not (X_MOD / "tlog" / "tile.go").is_file() or not (X_MOD / "note" / "note.go").is_file():
        pytest.skip(f"no golang.org/x/mod sources under {GOPATH} (`make oracle` installs golang-golang-x-mod-dev)")
    out = tmp_path_factory.mktemp("oracle") / "tlogcheck"
    env = {**os.environ, "GOPATH": str(GOPATH), "GO111MODULE": "off", "GOFLAGS": "", "CGO_ENABLED": "0"}
    if not os.access(os.path.expanduser("~"), os.W_OK):
        env.setdefault("GOCACHE", str(tmp_path_factory.mktemp("gocache")))
    built = subprocess.run([go, "build", "-o", str(out), "."], cwd=ORACLE_SRC, env=env, capture_output=True,
                           text=True, timeout=900)
    assert built.returncode == 0, built.stderr
    return out


def run_oracle(oracle: Path, where: str | Path, vkey: str, *flags: str) -> tuple[int, str]:
    done = subprocess.run([str(oracle), "-log", str(where), "-vkey", vkey, *flags], capture_output=True,
                          text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture
def signed_log(root, tmp_path):
    """A root whose ledger signed a checkpoint at each of SIGNED_AT, with a copy of its public log as it
    was at each (`tmp_path/at-{size}/`: that size's partial tiles) and its verifier key."""
    msgs = batch_for([f"run-{i}" for i in range(RUNS)], PER_RUN)
    msgs.sort(key=lambda m: (m[2] % PER_RUN, m[2]))  # the runs interleaved, as several workers send
    msgs = [(s, d, i + 1) for i, (s, d, _) in enumerate(msgs)]
    ledger = service.Ledger(root)
    done = 0
    for size in SIGNED_AT:
        ledger.write(ledger.decode(msgs[done:size]))
        ledger.commit()
        ledger.tlog.sign()
        done = size
        shutil.copytree(root / "tlog", tmp_path / f"at-{size}")
    return root, note.read_key(tlog.key_file()).verifier.text()


def test_the_go_checksum_database_code_reads_our_tiles_and_checks_our_proofs(oracle, signed_log, tmp_path, capsys):
    root, vkey = signed_log
    cp = checkpoint.open_signed((root / "tlog/checkpoint").read_text(), [note.Verifier.parse(vkey)])
    assert cp.size == SIGNED_AT[-1]
    for size in SIGNED_AT:  # each size's own files: its partial tiles and bundle, every leaf's inclusion
        rc, out = run_oracle(oracle, tmp_path / f"at-{size}", vkey)
        assert rc == 0 and out.endswith("ok\n"), out
        assert f"size {size}, root " in out and f"inclusion: {size} leaves checked" in out, out
    rc, out = run_oracle(oracle, root / "tlog", vkey)
    assert f"root {base64.b64encode(cp.root).decode()}, signed by {note.Verifier.parse(vkey).name}" in out, out

    # our inclusion proofs (`runledger tlog prove`) and consistency proofs (`runledger tlog consistency`)
    envs = read_events(root, columns=["event_id", "run_id", "producer", "attempt", "seq", "hash"]).to_pylist()
    index = {e: i for i, e in enumerate(tiles.Tiles(root / "tlog").entries(cp.size))}
    flags, proved = [], {}
    for env in envs[::397]:
        out = tmp_path / f"{env['event_id']}.tlog-proof"
        assert main(["tlog", "prove", env["event_id"], "--root", str(root), "--out", str(out)]) == 0
        flags += ["-proof", str(out)]
        proved[out.name] = tlog.entry_of(env)
    for old, new in [(1, 2), (1, cp.size), (255, 256), (256, 257), (255, 2048), (257, 1000), (cp.size, cp.size)]:
        capsys.readouterr()
        assert main(["tlog", "consistency", str(old), str(new), "--root", str(root)]) == 0
        (tmp_path / f"c-{old}-{new}.json").write_text(capsys.readouterr().out)
        flags += ["-consistency", str(tmp_path / f"c-{old}-{new}.json")]
    for size in SIGNED_AT[:-1]:  # each earlier signed checkpoint, as an auditor kept it
        flags += ["-old", str(tmp_path / f"at-{size}" / "checkpoint")]
    rc, out = run_oracle(oracle, root / "tlog", vkey, *flags)
    assert rc == 0 and out.endswith("ok\n"), out
    for name, entry in proved.items():  # the leaf each proof proves is the event's entry
        assert f"proof {name}: leaf {index[entry]} {entry.decode()} under size {cp.size}: ok" in out, out
    assert out.count("consistency proof c-") == 7 and out.count("consistency: checkpoint") == len(SIGNED_AT) - 1

    # the same log read over HTTP, as any tile client reads it
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root / "tlog"))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rc, out = run_oracle(oracle, f"http://127.0.0.1:{server.server_port}/", vkey, "-sample", "97")
    finally:
        server.shutdown()
    assert rc == 0 and out.endswith("ok\n"), out


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("edit, said", [
    ("tile/0/005", "tile tile/0/005 differs from the one Go builds"),  # a full tile (under the root's subtrees)
    ("tile/0/012.p/4", "the tiles give root"),  # the partial tile of the last leaves
    ("tile/1/000.p/12", "the tiles give root"),  # the partial level-1 tile
    ("tile/entries/003", "the entry bundles give root"),  # an entry bundle (one leaf's hash edited)
])
def test_the_oracle_refuses_a_tampered_tile_or_bundle(oracle, signed_log, tmp_path, edit, said):
    root, vkey = signed_log
    bad = tmp_path / "bad"
    shutil.copytree(root / "tlog", bad)
    data = (bad / edit).read_bytes()
    _flip(bad / edit, data.index(b'"hash":"') + 10 if "entries" in edit else 77)
    rc, out = run_oracle(oracle, bad, vkey)
    assert rc == 1 and f"FAIL: {said}" in out, out


def test_the_oracle_refuses_a_rewritten_or_truncated_log_and_another_key(oracle, signed_log, tmp_path):
    root, vkey = signed_log
    signer = note.read_key(tlog.key_file())
    # the log rewritten from leaf 500 on (one entry changed) and re-signed with the same key: each signature
    # checks, but not its consistency with the checkpoint of size 1000 an auditor kept
    entries = list(tiles.Tiles(root / "tlog").entries(SIGNED_AT[-1]))
    at = entries[500].index(b'"hash":"') + 8
    entries[500] = entries[500][:at] + (b"1" if entries[500][at:at + 1] == b"0" else b"0") + entries[500][at + 1:]
    forged = tlog.Log(tmp_path / "forged", signer=signer)
    forged.append_entries(entries)
    forged.sign()
    kept = str(tmp_path / "at-1000" / "checkpoint")
    rc, out = run_oracle(oracle, forged.dir, vkey)
    assert rc == 0, out  # alone, a consistent rewrite is a well-formed log
    rc, out = run_oracle(oracle, forged.dir, vkey, "-old", kept)
    assert rc == 1 and "size 1000 is not consistent with the current size 3076" in out, out
    # the log as it was at 257, against the checkpoint of 1000 seen before: truncated
    rc, out = run_oracle(oracle, tmp_path / "at-257", vkey, "-old", kept)
    assert rc == 1 and "the log was truncated" in out, out
    # another key's verifier
    other = note.Signer.generate(signer.name).verifier.text()
    rc, out = run_oracle(oracle, root / "tlog", other)
    assert rc == 1 and "the checkpoint: the signed note does not verify" in out, out


def test_each_partitions_log_is_its_own_origin_and_checks(oracle, root):
    """A partitioned ledger's logs (tlog/p{N}/, origin `{key name}/p{N}`, signed by the one key): each
    checks on its own."""
    from runledger.ledger.ingest.partitions import Part, partition_of

    k = 2
    runs = [f"run-{i}" for i in range(8)]
    sizes = {}
    for p in range(k):
        mine = [r for r in runs if partition_of(r, k) == p]
        sizes[p] = 300 * len(mine)
        assert sizes[p]
        ledger = service.Ledger(root, position=Part(k, p))
        ledger.write(ledger.decode(batch_for(mine, 300)))
        ledger.commit()
        ledger.tlog.sign()
    signer = note.read_key(tlog.key_file())
    for p in range(k):
        rc, out = run_oracle(oracle, root / "tlog" / f"p{p}", signer.verifier.text())
        assert rc == 0 and f"origin {signer.name}/p{p}, size {sizes[p]}, " in out and out.endswith("ok\n"), out
