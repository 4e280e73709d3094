"""Model checkpoints attested: a saved checkpoint folder signed with OpenSSF model signing (a local EC key,
no Sigstore, no network), described by an in-toto Statement v1 with a SLSA Provenance v1 predicate of the
runledger checkpoint build type, and the statement's digest recorded as an `attestation` event; and the
check of all three (`runledger attest verify`).

In the folder, beside what was saved (neither is hashed into the model's digest):
    model.sig               model signing's Sigstore bundle (a DSSE envelope over its manifest)
    provenance.intoto.json  the statement, RFC 8785 canonical JSON: subject the folder's digest as model
                            signing signed it; externalParameters the config and its hash; resolvedDependencies
                            the data manifests' digests and the code commit; byproducts the signed log
                            checkpoints of the root when it was made (none available: said in
                            internalParameters, never invented)

The key is PEM (EC P-256) outside the data root, 0600: $RUNLEDGER_ATTEST_KEY, else `attest.key` beside the
transparency log's key ($XDG_CONFIG_HOME/runledger/), made on first use and said where, its public key in
`attest.pub` beside it. Needs the `[attest]` extra (model-signing, pyopenssl); `unavailable()` says why not.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import queue
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.contract.events import CheckpointAttested
from runledger.ledger.tlog import checkpoint as tlog_checkpoint
from runledger.ledger.tlog import log as tlog_log
from runledger.ledger.tlog import note

log = logging.getLogger(__name__)

KEY_ENV = "RUNLEDGER_ATTEST_KEY"
SIGNATURE = "model.sig"
STATEMENT = "provenance.intoto.json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
MODEL_SIGNING_TYPE = "https://model_signing/signature/v1.0"  # the predicate of model signing's own statement
BUILD_TYPE = "https://runledger.local/buildtypes/checkpoint/v1"  # (a name, not a page: documented in docs/)
BUILDER_ID = "https://runledger.local/builders/training-worker"
CHECKPOINT_MEDIA_TYPE = "text/plain; charset=utf-8"  # a C2SP signed note


class AttestFailed(ValueError):
    """An attestation that does not check; the message is the one-line reason."""


def unavailable() -> str | None:
    """Why checkpoints cannot be attested here (the `[attest]` extra missing), or None."""
    try:
        import model_signing.signing  # noqa: F401
        import OpenSSL  # noqa: F401
    except ImportError as err:
        return f"{err.name or err} is not installed (pip install 'runledger[attest]')"
    return None


# -- the key --

def key_file() -> Path:
    if os.environ.get(KEY_ENV):
        return Path(os.environ[KEY_ENV])
    return tlog_log.key_file().parent / "attest.key"


@dataclass(frozen=True)
class _Pem:
    """A PEM text as note.write_key writes a key (0600, never over another)."""

    pem: str

    def text(self) -> str:
        return self.pem.rstrip("\n")


def load_or_make_key(path: Path | None = None) -> Path:
    """The signing key's file (key_file()), made there (0600, EC P-256) on first use, saying where; its public
    key is written beside it (`.pub`)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    path = Path(path or key_file())
    if path.exists():
        note.read_secret(path)  # (refused if others may read it)
        return path
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    try:
        note.write_key(path, _Pem(pem))
    except FileExistsError:  # made meanwhile by another process
        return path
    public_file(path).write_bytes(public_pem(path))
    log.info("made the checkpoint attestation key %s (0600); its public key: %s", path, public_file(path))
    return path


def public_file(key: Path) -> Path:
    return key.with_suffix(".pub")


def public_pem(key: Path) -> bytes:
    """The public key (PEM SubjectPublicKeyInfo) of the private key in `key`."""
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(note.read_secret(key).encode(), password=None)
    return private.public_key().public_bytes(serialization.Encoding.PEM,
                                             serialization.PublicFormat.SubjectPublicKeyInfo)


def key_id(public: bytes) -> str:
    """SHA-256 of a PEM public key's DER SubjectPublicKeyInfo."""
    from cryptography.hazmat.primitives import serialization

    der = serialization.load_pem_public_key(public).public_bytes(serialization.Encoding.DER,
                                                                 serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


# -- the statement --

def log_checkpoints(root: Path | None) -> tuple[list[dict], str | None]:
    """The root's signed log checkpoints as SLSA ResourceDescriptors (its log's, or each partition's), and
    None; or [] and why there are none."""
    if root is None:
        return [], "no ledger root was given"
    from runledger.ledger.tlog import proofs

    out = []
    for d in proofs.logs_of(Path(root)):
        try:
            signed = (d / "checkpoint").read_text()
            cp = tlog_checkpoint.Checkpoint.parse(proofs.text_of(signed))
        except (OSError, ValueError) as err:
            log.warning("%s: its checkpoint is not readable (%s); not naming it", d, err)
            continue
        out.append({"name": (d / "checkpoint").relative_to(Path(root)).as_posix(),
                    "digest": {"sha256": hashlib.sha256(signed.encode()).hexdigest()},
                    "content": base64.b64encode(signed.encode()).decode(), "mediaType": CHECKPOINT_MEDIA_TYPE,
                    "annotations": {"origin": cp.origin, "size": cp.size, "root": base64.b64encode(cp.root).decode()}})
    if not out:
        return [], f"{root}: no signed transparency log checkpoint yet"
    return out, None


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def statement(*, name: str, subject_sha256: str, config: dict, config_hash: str, data_sources: list[dict],
              code_commit: str | None, run: dict, byproducts: list[dict], no_log: str | None,
              started: float, finished: float, content_hash: str | None = None) -> dict:
    """The in-toto Statement v1 (SLSA Provenance v1 predicate) of a checkpoint. `run`: run_id, producer,
    attempt, step, tokens_seen; `data_sources`: the `data` event's sources (domain, path, sha256, byte range)."""
    deps = [{"name": f"data/{s['domain']}/{s['path']}", "digest": {"sha256": s["sha256"]},
             "annotations": {"byte_start": s["byte_start"], "byte_end": s["byte_end"]}} for s in data_sources]
    if code_commit:
        deps.append({"name": "code", "digest": {"gitCommit": code_commit}})
    internal = {**run, "code_commit": code_commit, "tlog_checkpoint": "byproducts" if byproducts else f"none available: {no_log}"}
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": subject_sha256},
                     "annotations": {"content_hash": content_hash} if content_hash else {}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {"buildType": BUILD_TYPE,
                                "externalParameters": {"config": config, "config_hash": config_hash},
                                "internalParameters": internal,
                                "resolvedDependencies": deps},
            "runDetails": {"builder": {"id": BUILDER_ID, "version": {"runledger": _version()}},
                           "metadata": {"invocationId": f"{run['run_id']}:{run['producer']}:{run['attempt']}",
                                        "startedOn": rfc3339(started), "finishedOn": rfc3339(finished)},
                           "byproducts": byproducts},
        },
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("runledger")
    except PackageNotFoundError:
        return "unknown"


def statement_bytes(st: dict) -> bytes:
    return canonical_json(st).encode()


# -- signing --

def sign_folder(folder: Path, key: Path) -> str:
    """Sign `folder` with model signing (the statement and signature files left out); the digest it signed."""
    from model_signing import hashing, signing

    hashed = hashing.Config().set_ignored_paths(paths=[SIGNATURE, STATEMENT])
    signing.Config().use_elliptic_key_signer(private_key=key).set_hashing_config(hashed).sign(folder, folder / SIGNATURE)
    return signed_subject(folder / SIGNATURE)


def signed_subject(sig: Path) -> str:
    """The subject digest of model signing's statement inside its bundle (AttestFailed if it has none)."""
    try:
        bundle = json.loads(Path(sig).read_bytes())
        inner = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
        if inner.get("predicateType") != MODEL_SIGNING_TYPE:
            raise AttestFailed(f"{sig}: not a model signing signature ({inner.get('predicateType')!r})")
        return inner["subject"][0]["digest"]["sha256"]
    except FileNotFoundError:
        raise AttestFailed(f"{sig}: no model signing signature") from None
    except (ValueError, KeyError, IndexError, TypeError) as err:
        if isinstance(err, AttestFailed):
            raise
        raise AttestFailed(f"{sig}: not a model signing bundle ({type(err).__name__}: {err})") from None


def attest(folder: str | Path, *, key: Path, root: Path | None, config: dict, config_hash: str,
           data_sources: list[dict], code_commit: str | None, run: dict, started: float,
           content_hash: str | None = None) -> CheckpointAttested:
    """Sign `folder`, write its statement beside the signature, and return the `attestation` event."""
    t0 = time.perf_counter()
    folder = Path(folder).resolve()
    subject = sign_folder(folder, key)
    byproducts, no_log = log_checkpoints(root)
    st = statement(name=f"{run['run_id']}/{folder.name}", subject_sha256=subject, config=config,
                   config_hash=config_hash, data_sources=data_sources, code_commit=code_commit, run=run,
                   byproducts=byproducts, no_log=no_log, started=started, finished=time.time(),
                   content_hash=content_hash)
    data = statement_bytes(st)
    tlog_log.write_file(folder / STATEMENT, data)
    return CheckpointAttested(path=str(folder), subject_sha256=subject, statement_sha256=hashlib.sha256(data).hexdigest(),
                              key_id=key_id(public_pem(key)), content_hash=content_hash,
                              tlog_size=byproducts[0]["annotations"]["size"] if byproducts else None,
                              seconds=time.perf_counter() - t0)


class Attester:
    """Attests a run's checkpoints in one background thread (the training loop only queues the folder), and
    emits each `attestation` event into `sink`. `wait()` before reusing a folder or finishing the run."""

    def __init__(self, sink, *, root: Path | None, run: dict, data_sources: list[dict], code_commit: str | None,
                 key: Path | None = None) -> None:
        """`run`: run_id, producer, attempt; `data_sources`: the `data` event's sources."""
        self.sink, self.root, self.run = sink, root, run
        self.args = {"data_sources": data_sources, "code_commit": code_commit}
        self.key = load_or_make_key(key)
        self.started = time.time()
        self.done: list[CheckpointAttested] = []
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="attest", daemon=True)
        self._thread.start()

    def submit(self, folder: str | Path, step: int, *, config: dict, config_hash: str, content_hash: str | None,
               tokens_seen: int | None = None) -> None:
        """Attest `folder` (saved at `step`, with the config in force then) in the background."""
        self._queue.put((folder, step, {"config": config, "config_hash": config_hash, "content_hash": content_hash},
                         tokens_seen))

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                folder, step, saved, tokens = job
                try:
                    event = attest(folder, key=self.key, root=self.root,
                                   run={**self.run, "step": step, "tokens_seen": tokens},
                                   started=self.started, **saved, **self.args)
                    self.sink.emit(event, step=step)  # (sinks are thread-safe: the heartbeat's thread emits too)
                except Exception as err:  # a checkpoint left unattested never stops the run: said, no event
                    log.error("checkpoint %s not attested: %s: %s", folder, type(err).__name__, err)
                    continue
                self.done.append(event)
            finally:
                self._queue.task_done()

    def wait(self) -> None:
        """Until every checkpoint queued is attested (or failed, said)."""
        self._queue.join()

    def close(self) -> None:
        self.wait()
        self._queue.put(None)
        self._thread.join()


# -- checking --

def _stored_events(root: Path, run_id: str) -> list[tuple[str, dict]]:
    from runledger.ledger.storage.reads import read_events

    t = read_events(Path(root), kind="attestation", run_id=run_id, columns=["event_id", "payload"])
    return [(e, json.loads(p)) for e, p in zip(t.column("event_id").to_pylist(), t.column("payload").to_pylist())]


def verify(folder: str | Path, *, public: bytes, root: Path | None) -> str:
    """Check a checkpoint's attestation: model signing's own verifier with `public` (the folder is what was
    signed), the statement's subject is the signed digest, and (with `root`) a stored `attestation` event
    of its run carries the statement's digest and the key's id. Returns a one-line summary; AttestFailed
    names the first difference."""
    folder = Path(folder).resolve()
    subject, st, digest = check_folder(folder, public)
    if root is None:
        return f"ok: {folder} signed (subject {subject[:12]}…), statement {digest[:12]}… (not matched to a ledger)"
    run = st["predicate"]["buildDefinition"]["internalParameters"].get("run_id")
    events = _stored_events(Path(root), run) if isinstance(run, str) else []
    mine = [(e, p) for e, p in events if p.get("statement_sha256") == digest]
    if not mine:
        near = [e for e, p in events if p.get("subject_sha256") == subject]
        raise AttestFailed(f"{folder / STATEMENT}: its digest {digest[:12]}… is in no attestation event of run {run!r} in "
                           f"{root}" + (f" (event {near[0]} attests this folder with another statement)" if near else ""))
    event_id, payload = mine[0]
    check_event(event_id, payload, subject, public)
    logged = check_log_checkpoints(st, Path(root))
    return f"ok: {folder} signed (subject {subject[:12]}…), statement {digest[:12]}… = event {event_id}{logged}"


def check_folder(folder: Path, public: bytes) -> tuple[str, dict, str]:
    """The folder's own half of `verify`: model signing's verifier with `public`, and its statement (canonical,
    in-toto SLSA provenance, its subject the digest signed). Returns (the subject, the statement, the
    statement's SHA-256); AttestFailed names the first difference."""
    from model_signing import verifying

    try:
        data = (folder / STATEMENT).read_bytes()
    except FileNotFoundError:
        raise AttestFailed(f"{folder}: no {STATEMENT}: the checkpoint was not attested") from None
    with tempfile.NamedTemporaryFile(suffix=".pub") as f:
        f.write(public)
        f.flush()
        try:
            verifying.Config().use_elliptic_key_verifier(public_key=f.name).verify(folder, folder / SIGNATURE)
        except FileNotFoundError:
            raise AttestFailed(f"{folder}: no {SIGNATURE}: the checkpoint was not signed") from None
        except Exception as err:  # model signing's refusal (ValueError: a file's hash; a bad signature; ...)
            raise AttestFailed(f"model signing refuses {folder}: {_one_line(err)}") from None
    subject = signed_subject(folder / SIGNATURE)
    try:
        st = json.loads(data)
    except ValueError:
        raise AttestFailed(f"{folder / STATEMENT}: not JSON") from None
    if statement_bytes(st) != data:
        raise AttestFailed(f"{folder / STATEMENT}: not canonical JSON (RFC 8785): not as written")
    if st.get("_type") != STATEMENT_TYPE or st.get("predicateType") != PREDICATE_TYPE:
        raise AttestFailed(f"{folder / STATEMENT}: not an in-toto statement of SLSA provenance v1")
    if [s.get("digest", {}).get("sha256") for s in st.get("subject", [])] != [subject]:
        raise AttestFailed(f"{folder / STATEMENT}: its subject is not the digest model signing signed ({subject[:12]}…)")
    return subject, st, hashlib.sha256(data).hexdigest()


def check_event(event_id: str, payload: dict, subject: str, public: bytes) -> None:
    """The ledger's half of `verify`: the `attestation` event whose statement digest is the folder's names the
    subject model signing signed and the key given; AttestFailed if not."""
    if payload.get("subject_sha256") != subject:
        raise AttestFailed(f"event {event_id}: its subject {payload.get('subject_sha256', '')[:12]}… is not the folder's")
    if payload.get("key_id") != key_id(public):
        raise AttestFailed(f"event {event_id}: signed with key {payload.get('key_id', '')[:12]}…, not the key given")


def check_stored(rows: list[tuple[str, dict]], root: Path | None, *, keys: list[bytes] | None = None):
    """`verify`'s check of each stored `attestation` event (event_id, payload) of a root or an export, for
    `runledger verify` and the tlog audit (runledger.ledger.check.attested): the event's folder holds the
    statement whose digest the event fixes, and it checks (`check_folder`, `check_event`, and with `root` the
    log checkpoints it names); a failing one is a problem naming the event. A folder not at hand (the event
    names a path on the producer's machine; a checkpoint deleted since) or holding a later attestation of
    its path (saved again) is counted as not at hand: an absent checkpoint claims nothing. `keys`: the
    signers' public keys (PEM; an event signed by another is a problem), else the local key's if there is
    one; an event no key is at hand for, or all without the `[attest]` extra, is counted as unchecked."""
    from runledger.ledger.check.attested import Attested
    from runledger.ledger.tlog import proofs

    out = Attested()
    why = unavailable()
    if why is not None:
        out.unchecked = {e: f"the [attest] extra is missing: {why}" for e, _ in rows}
        return out
    given = keys is not None
    by_id = {key_id(k): k for k in (keys if given else _local_public())}
    fixed: dict[str, set] = {}  # a folder -> the statement digests its events fix
    for _, p in rows:
        fixed.setdefault(str(p.get("path")), set()).add(p.get("statement_sha256"))
    logs = root is not None and bool(proofs.logs_of(Path(root)))
    for event_id, p in rows:
        folder = Path(str(p.get("path")))
        if not folder.is_dir():
            out.absent.append(event_id)
            continue
        try:
            now = hashlib.sha256((folder / STATEMENT).read_bytes()).hexdigest()
        except OSError:
            now = None
        if now != p.get("statement_sha256") and now in fixed[str(p.get("path"))]:
            out.absent.append(event_id)  # (the folder was saved and attested again: a later event fixes it)
            continue
        public = by_id.get(p.get("key_id"))
        if public is None and not given:
            out.unchecked[event_id] = "no public key of the signer at hand (give --attest-key F, the signer's attest.pub)"
            continue
        try:
            if public is None:
                raise AttestFailed(f"signed with key {str(p.get('key_id'))[:12]}…, not a key given")
            subject, st, digest = check_folder(folder.resolve(), public)
            if digest != p.get("statement_sha256"):
                raise AttestFailed(f"{folder / STATEMENT}: its digest {digest[:12]}… is not the one the event fixes "
                                   f"({str(p.get('statement_sha256'))[:12]}…)")
            check_event(event_id, p, subject, public)
            if logs:
                check_log_checkpoints(st, Path(root))
        except AttestFailed as err:
            out.problems.append(f"attestation {event_id}: {err}")
            continue
        out.checked += 1
    return out


def _local_public() -> list[bytes]:
    """The local attestation key's public key (`attest.pub` beside it), if there is one."""
    try:
        return [public_file(key_file()).read_bytes()]
    except OSError:
        return []


def read_public(paths: list[str]) -> list[bytes]:
    """The public keys (PEM) in the files `paths`; ValueError (one line) for one that is not a public key."""
    keys = []
    for path in paths:
        data = Path(path).read_bytes()
        try:
            key_id(data)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{path}: not a PEM public key ({err})") from None
        keys.append(data)
    return keys


def verify_run(root: Path, run_id: str, *, public: bytes) -> list[str]:
    """`verify` of every checkpoint folder a `checkpoint` event of the run names, in step order, as far as
    the first that fails (AttestFailed, naming it); their summaries."""
    from runledger.ledger.storage.reads import read_events

    t = read_events(Path(root), kind="checkpoint", run_id=run_id, columns=["step", "payload"])
    paths = dict.fromkeys(json.loads(p)["path"] for _, p in sorted(zip(t.column("step").to_pylist(),
                                                                       t.column("payload").to_pylist()),
                                                                   key=lambda r: (r[0] is None, r[0] or 0)))
    if not paths:
        raise AttestFailed(f"run {run_id!r} has no checkpoint event in {root}")
    return [verify(p, public=public, root=Path(root)) for p in paths]


def check_log_checkpoints(st: dict, root: Path) -> str:
    """The log checkpoints a statement names are checkpoints of the root's log (their tree is the log's at
    their size, same origin); what to add to the summary. AttestFailed names the first that is not."""
    from runledger.ledger.tlog import merkle, proofs, tiles

    said = []
    for bp in st["predicate"]["runDetails"].get("byproducts", []):
        name = bp.get("name", "")
        if not name.startswith(tlog_log.PUBLIC_DIR + "/"):
            continue
        try:
            signed = base64.b64decode(bp["content"], validate=True)
            if hashlib.sha256(signed).hexdigest() != bp["digest"]["sha256"]:
                raise AttestFailed(f"the statement's {name}: its content is not its digest")
            cp = tlog_checkpoint.Checkpoint.parse(proofs.text_of(signed.decode()))
            reader = tiles.Tiles((root / name).parent)
            now = tlog_checkpoint.Checkpoint.parse(proofs.text_of(reader.checkpoint()))
        except AttestFailed:
            raise
        except (OSError, ValueError, KeyError, TypeError, tiles.TileMissing) as err:
            raise AttestFailed(f"the statement's {name} cannot be checked against {root}: {_one_line(err)}") from None
        if cp.origin != now.origin or cp.size > now.size or \
                merkle.tree_hash(reader.node(now.size), cp.size) != cp.root:
            raise AttestFailed(f"the statement's {name} (log {cp.origin}, size {cp.size}) is not a checkpoint of "
                               f"{root}'s log ({now.origin}, size {now.size})")
        said.append(f"{name} size {cp.size}")
    return f"; its log checkpoint is the root's log's ({', '.join(said)})" if said else "; it names no log checkpoint"


def _one_line(err: Exception) -> str:
    """model signing's refusal in a line: the files whose hash differs, else its own words, cut short."""
    changed = re.findall(r"Hash mismatch for \\?'([^'\\]+)\\?'", str(err))  # (inside a list's repr: quotes escaped)
    if changed:
        return f"{', '.join(changed)}: not the bytes signed"
    text = " ".join(str(err).split())
    return (text[:300] + "…") if len(text) > 300 else text
