"""A run of any training loop: `init` starts one, `Run.log` records any named numbers, `Run.finish` ends it.

Each call becomes an event of the contract (`runledger.ledger.contract.events`), sealed into the run's hash chain and
written to the spool on local disk before the call returns (`runledger.ledger.emit.emitter.Emitter`), so a SIGKILL of
the script loses nothing `log` accepted: the next `init(resume=True)` of the run, or the root's local
supervisor, sends what was left. `init` emits `run_started` (the config, tags, host), `log` a `metrics`
event per step (a value that is not finite is kept as null and named in `nonfinite`), `run.config[k] = v`
after the start a `config` event, `alert` an `alert`, and `finish` a `run_finished` with the summary.
A crash finishes the run as `failed`, Ctrl-C or SIGTERM as `stopped` (atexit and signal handlers).

Where the events go: with $RUNLEDGER_NATS or $RUNLEDGER_CREDS (or `nats=`) set, to that server; else to
the root's embedded local server and ledger (`runledger.ledger.local`), started on first use and shared by every
process logging to the root.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import platform
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from runledger.content import content_of
from runledger.ledger import local, settings
from runledger.ledger.redact import redact
from runledger.ledger.contract.canonical import canonical_json
from runledger.ledger.bus import jetstream as bus
from runledger.ledger.emit.chains import claim_attempt, next_attempt
from runledger.ledger.contract.columns import WIDE_COLUMNS_PER_RUN
from runledger.ledger.emit.emitter import Emitter, origin, send_leftovers
from runledger.ledger.emit.heartbeat import Heartbeat, interval_s as heartbeat_interval_s
from runledger.ledger.contract.events import MAX_LABEL, MAX_METRIC_NAME, MAX_METRICS, NAME_RE
from runledger.ledger.emit.sink import NullSink
from runledger.ledger.emit.spool import chain_dir
from runledger.queries.names import slug
from runledger.queries.thresholds import LOSS_UNITS, NAMES, PROFILES
from runledger import values
from runledger.console import Console, wanted as console_wanted
from runledger.system import SystemSampler
from runledger.wandb_compat import Media, WandbRun, mode_of, silent, skipped, skipped_value, where_line

log = logging.getLogger("runledger")

PRODUCER = "main"  # the producer name of a run's own process (several processes of one run: pass producer=)
REMOTE_LEDGER_WAIT_S = 5.0  # for the ledger of a server of $RUNLEDGER_NATS to say a run's attempts (it runs already or not at all)
FINISH_WAIT_ENV = "RUNLEDGER_FINISH_WAIT"  # "1": finish waits for the ledger's confirmation, as finish(wait=True)
REACH_S = 3.0  # for a server of $RUNLEDGER_NATS to accept a connection; else the run starts offline
FINISH_TIMEOUT_S = 60.0  # for the ledger to store what the run logged
_BAD_NAME = re.compile(r"[\x00-\x1f\x7f]")
_NUMBERS = frozenset({float, int})
_ID_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789"


class LogError(ValueError):
    """Input `log` (or `init`, `alert`) refuses; the message is the one-line reason. Nothing already
    accepted is affected."""


class AlertLevel:
    """W&B's alert levels, as `runledger.alert(level=...)` takes them."""

    INFO = "INFO"
    WARN = "WARN"
    ERROR = "ERROR"


_SEVERITY = {"INFO": "info", "WARN": "warn", "WARNING": "warn", "ERROR": "fail"}
_RESUME = (None, False, True, "allow", "must", "never", "auto")


def _json_value(v: Any) -> Any:
    """A config value as JSON can hold it: numbers, strings, booleans, null, lists and dicts;
    numpy/JAX scalars as numbers, a float that is not finite as its name ("nan"), anything else as str."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if v - v == 0.0 else repr(v)
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
        return _json_value(v.item())
    return str(v)


class AttrDict(dict):
    """A dict whose keys also read and set as attributes (`config.lr`), as W&B's config and summary do."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


class Config(AttrDict):
    """`run.config`. Set after the run started, a key is recorded as a `config` event."""

    def __init__(self, data: dict, run: "Run | None" = None) -> None:
        super().__init__({str(k): _json_value(v) for k, v in data.items()})
        object.__setattr__(self, "_run", run)

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def update(self, data: dict | None = None, allow_val_change: bool | None = None, **kw) -> None:
        changes = {str(k): _json_value(v) for k, v in {**(data or {}), **kw}.items()}
        changes = {k: v for k, v in changes.items() if k not in self or self[k] != v}
        super().update(changes)
        if changes and self._run is not None:
            self._run._config_changed(changes)

    def setdefaults(self, data: dict) -> None:
        self.update({k: v for k, v in data.items() if k not in self})

    def as_dict(self) -> dict:
        return dict(self)


class Summary(AttrDict):
    """`run.summary`: what `finish` records as the run's summary, read back during the run: each metric's
    last logged value (or what `define_metric` asked for), and what was set here (until logged again)."""


def metrics_payload(data: dict, ok_names: set[str], prefix: str = "", out: dict | None = None) -> dict:
    """The `metrics` payload of one `log` call: {"metrics": {name: float | None}} plus, when a value is
    not finite, "nonfinite": {name: "nan" | "inf" | "-inf"}, and a string or None (as W&B's log takes
    them) in "text": {name: str | None}. A nested dict's names join with "/". A value it cannot store yet
    (a list, an array, a W&B Table, Image or Histogram) is skipped with one warning per kind
    (`runledger.wandb_compat`). Raises LogError naming the first bad name. `ok_names`: names already
    checked (they repeat every step, and checking each once is cheaper)."""
    if out is None and not prefix and ok_names.issuperset(data) and len(data) <= MAX_METRICS:
        types = set(map(type, data.values()))  # the common case at C speed: known names, finite floats
        if types <= _NUMBERS and (total := sum(data.values())) - total == 0.0:
            return {"metrics": dict(data)}  # (a finite sum: every value finite; else the loop below)
    out = {"metrics": {}} if out is None else out
    metrics = out["metrics"]
    for key, v in data.items():
        name = prefix + key if type(key) is str else None
        if name not in ok_names:
            _check_name(key, name)
            ok_names.add(name)
        t = type(v)
        if t is not float:
            if t is int or t is bool:
                v = float(v)
            elif t is dict:
                metrics_payload(v, ok_names, name + "/", out)
                continue
            elif v is None or isinstance(v, str):
                out.setdefault("text", {})[name] = None if v is None else str(v)
                continue
            elif isinstance(v, Media) or not hasattr(v, "__float__") or getattr(v, "ndim", 0):
                out.setdefault("rich", {})[name] = v  # (Run.log records it: runledger.values)
                continue
            else:
                try:  # numpy and JAX scalars, 0-d arrays
                    v = float(v)
                except (TypeError, ValueError):
                    skipped_value(name, v)
                    continue
        if v - v == 0.0:
            metrics[name] = v
        else:  # nan (nan - nan is nan), inf, -inf (inf - inf is nan)
            metrics[name] = None
            out.setdefault("nonfinite", {})[name] = "nan" if v != v else ("inf" if v > 0 else "-inf")
    if len(metrics) > MAX_METRICS or len(out.get("text", ())) > MAX_METRICS:
        raise LogError(f"{max(len(metrics), len(out.get('text', ())))} metrics in one call: at most {MAX_METRICS}")
    return out


def _check_name(key: Any, name: str | None) -> None:
    if name is None:
        raise LogError(f"metric name {key!r} is not a string")
    if not name or len(name) > MAX_METRIC_NAME:
        raise LogError(f"metric name {name[:40]!r}... has {len(name)} characters: 1 to {MAX_METRIC_NAME}")
    if _BAD_NAME.search(name):
        raise LogError(f"metric name {name!r} holds a control character")


def run_id_for(name: str | None, project: str | None) -> str:
    """A run id made of an id-like text ("My Run 3" -> "my-run-3": Levanter's run ids), or a new one
    (`new_run_id`)."""
    if name:
        made = slug(name)
        if not NAME_RE.fullmatch(made or "-"):
            raise LogError(f"run name {name!r} gives no run id: use letters or digits")
        return made
    return new_run_id(None, project)


def new_run_id(name: str | None, project: str | None) -> str:
    """A fresh run id, readable: the name made an id plus 8 random letters or digits ("My Run" ->
    "my-run-k3x9q2ab"), or, for a run with no name (or none with a letter or digit), the project and the time."""
    suffix = "".join(secrets.choice(_ID_CHARS) for _ in range(8))
    made = slug(name or "")[:55].rstrip("-_")
    if made:
        return f"{made}-{suffix}"
    base = slug(project or "run")[:36].rstrip("-_") or "run"
    return f"{base}-{time.strftime('%Y%m%d-%H%M%S')}-{suffix[:6]}"


def _which_run(root: Path, name: str | None, project: str | None, resume: bool | str | None) -> tuple[str, bool]:
    """The run `init` starts or goes on with when given no id, and whether it is new: with `resume` and a
    name, the one run of that name in that project (a run stored before names were kept: the one whose id
    is the name made an id, as it was given then); else a new one."""
    if name is None or resume in (None, False, "never"):
        return new_run_id(name, project), True
    from runledger.ledger.storing import wait_stored
    from runledger.queries.names import runs_named  # (DuckDB: only to look a name up)

    wait_stored(root)  # (a run of that name that finished a moment ago: stored first)
    found = runs_named(root, name, project)
    if len(found) == 1:
        return found[0], False
    if not found and resume == "must":
        raise LogError(f"no run is named {name!r} in project {project!r}, and resume='must'")
    if found:
        if resume == "must":
            raise LogError(f"{len(found)} runs are named {name!r} in project {project!r} ({', '.join(found)}): "
                           "pass id= to say which")
        log.warning("%d runs are named %r in project %r (%s): starting a new one; pass id= to go on with one of them",
                    len(found), name, project, ", ".join(found))
    return new_run_id(name, project), True


def _code_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=2,
                             env=settings.child_env())  # (no server URL or creds)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _last_step(root: Path, spool: Path, run_id: str) -> int | None:
    """The last step this run logged: stored under `root`, or left in this machine's spool."""
    from runledger.ledger.storage.reads import read_events  # (pyarrow: only on resume)

    steps = []
    try:
        t = read_events(root, run_id=run_id, columns=["step"])
        steps += [s for s in t.column("step").to_pylist() if s is not None]
    except (OSError, ValueError):
        pass
    for seg in spool.glob(f"{run_id}/*/*/seg-*.jsonl"):
        for line in seg.read_bytes().splitlines()[-3:]:
            m = re.search(rb'"step":(\d+)', line)
            steps += [int(m.group(1))] if m else []
    for intake in spool.glob(f"{run_id}/*/*/in-*.jsonl"):  # accepted, not yet sealed: [seq, kind, step, ...]
        data = intake.read_bytes()
        steps += [int(m) for m in re.findall(rb'(?m)^\[\d+,"[a-z_]+",(\d+),', data[:data.find(b"\0")] if b"\0" in data else data)]
    return max(steps, default=None)


class Run(WandbRun):
    """One attempt of a run, logging through a sink; made by `init`. W&B's other calls of a run (url, dir,
    save, log_artifact, define_metric, ...) are `runledger.wandb_compat.WandbRun`'s."""

    _console: Console | None = None  # the capture of the script's stdout and stderr (init's, by default)

    def __init__(self, run_id: str, *, project: str | None, name: str | None, root: Path, sink, attempt: int,
                 config: dict, tags: list[str], first_step: int, attachment: local.Attachment | None,
                 mode: str = "online", entity: str | None = None) -> None:
        self.id = self.run_id = run_id
        self.mode, self.entity = mode, entity
        self.name, self.project, self.root, self.attempt, self.tags = name or run_id, project, root, attempt, tags
        self._sink, self._attachment = sink, attachment
        self._accept = getattr(sink, "accept", None) or sink.emit_dict  # (the Emitter's: sealed off this thread)
        self._step = first_step  # the next step `log` takes when not given one
        self._pending: dict | None = None  # log(commit=False) data waiting for its step's commit
        self._pending_step: int | None = None
        self._names: set[str] = set()
        self._top = -1  # the highest step this attempt logged: a lower one is dropped (as W&B does)
        self._dropped = 0
        self.finished = False
        self.config = Config({})
        self.config.update(config)
        object.__setattr__(self.config, "_run", self)
        self.summary = Summary()
        self._sampler: SystemSampler | None = None
        self._heartbeat: Heartbeat | None = None
        self._offline = False  # init found no server (or mode="offline"): the spool holds the events
        self._config_hash: str | None = None  # of this attempt's run_started: its checkpoints carry it

    # -- logging

    @property
    def step(self) -> int:
        """The step the next `log` without a step is recorded at."""
        return self._step

    def log(self, data: dict, step: int | None = None, commit: bool | None = None) -> None:
        """Record named numbers at `step` (default: one past the last step logged). With commit=False
        they wait for the next call that commits that step, and are recorded with it."""
        if self.finished:
            raise LogError(f"run {self.run_id} is finished: start another with runledger.init()")
        if type(data) is not dict:
            raise LogError(f"log takes a dict of names to numbers, not a {type(data).__name__}")
        if step is None:
            step = self._step if self._pending_step is None else self._pending_step
        else:
            if type(step) is not int or step < 0:
                if hasattr(step, "__index__") and not isinstance(step, bool) and step.__index__() >= 0:
                    step = step.__index__()
                else:
                    raise LogError(f"step {step!r} is not an integer >= 0")
            if step < self._top:
                self._drop_step(step)
                return
        if self._pending is not None and step != self._pending_step:
            self._commit()
        known = len(self._names)
        try:
            payload = metrics_payload(data, self._names, out=self._pending)
        finally:
            if known <= WIDE_COLUMNS_PER_RUN < len(self._names):  # once: names past the bound are stored all the same
                log.warning("run %s has logged more than %d metric names: the names past them may be kept in the "
                            "narrow form (the MAP column \"metrics/\"), which every view reads alike, but a query of "
                            "one reads it more slowly than a name's own column", self.run_id, WIDE_COLUMNS_PER_RUN)
        if "rich" in payload:  # a Histogram, Table, Image or File, a list or an array: events of their own, now
            with _Deferred.signals():
                values.record(self, payload.pop("rich"), step)
        if commit is False:
            self._pending, self._pending_step = payload, step
            return
        self._pending = None
        self._pending_step = None
        self._emit_metrics(payload, step)

    def _commit(self) -> None:
        payload, step = self._pending, self._pending_step
        self._pending = self._pending_step = None
        if payload and payload["metrics"]:
            self._emit_metrics(payload, step)

    def _emit_metrics(self, payload: dict, step: int) -> None:
        with _Deferred.signals():
            self._accept("metrics", payload, step)
        if len(payload) == 1 and self._defined is None:
            self.summary.update(payload["metrics"])
        else:
            self._summarize({**payload["metrics"], **payload.get("text", {})})
        if step > self._top:
            self._top = step
            if step >= self._step:
                self._step = step + 1

    def _drop_step(self, step: int) -> None:
        """A step below the last this attempt logged is dropped, as W&B drops it; counted in the summary's
        `_dropped_steps` (a resumed attempt may redo the steps of the one before: those are kept)."""
        self._dropped += 1
        self.summary["_dropped_steps"] = self._dropped
        skipped("log of a lower step", f"step {step} is below step {self._top}, the last this attempt logged: dropped, "
                "as W&B does (counted in the summary's _dropped_steps)")

    def _record(self, kind: str, payload: dict) -> None:
        """Emit an event of `kind` at the last step logged (the calls beyond log: config, alert, artifact)."""
        if self.finished:
            raise LogError(f"run {self.run_id} is finished: start another with runledger.init()")
        with _Deferred.signals():
            self._sink.emit_dict(kind, payload, self._step - 1 if self._step else None)

    def alert(self, title: str, text: str | None = None, level: str | None = AlertLevel.INFO, wait_duration: Any = None,
              webhook_url: str | None = None) -> None:
        """Record an alert (W&B's and Trackio's `alert`): INFO, WARN or ERROR (as info, warn, fail). A
        `webhook_url` is not called from here (`runledger notify` delivers alerts): one warning."""
        severity = _SEVERITY.get(str(getattr(level, "value", level) or AlertLevel.INFO).upper())
        if severity is None:
            raise LogError(f"alert level {level!r}: INFO, WARN or ERROR")
        if webhook_url is not None:
            skipped("alert(webhook_url=)", "runledger notify delivers alerts to webhooks; the alert itself is recorded")
        self._record("alert", {"alert_id": f"{self.run_id}:{self.attempt}:{secrets.token_hex(6)}",
                               "agent": self._producer, "rule": str(title), "severity": severity,
                               "message": "" if text is None else str(text)})

    def log_checkpoint(self, path: str | os.PathLike, step: int | None = None, *, seconds: float | None = None,
                       reason: str = "periodic", tokens_seen: int | None = None) -> dict:
        """Record a `checkpoint` event for the checkpoint saved at `path` (a file or a folder, already written):
        its absolute path, bytes and content hash (`runledger.content.content_of`: a file's SHA-256, a folder's
        over its files' manifest), the config hash of this attempt's `run_started` (the `config_match` audit
        holds them equal), `seconds` the save took where the caller timed it (else null), at `step` (default: the
        last step logged). reason: periodic, requested, final or rollback. Returns the payload recorded."""
        if self.finished:
            raise LogError(f"run {self.run_id} is finished: start another with runledger.init()")
        if reason not in ("periodic", "requested", "final", "rollback"):
            raise LogError(f"checkpoint reason {reason!r}: periodic, requested, final or rollback")
        if self._disabled:
            return {}
        try:
            facts = content_of(path)
        except FileNotFoundError as err:
            raise LogError(f"checkpoint {err}") from None
        payload = {"path": str(Path(path).resolve()), "bytes": facts["bytes"], "content_hash": facts["sha256"],
                   "config_hash": self._config_hash, "reason": reason}
        if seconds is not None:
            payload["seconds"] = float(seconds)
        if tokens_seen is not None:
            payload["tokens_seen"] = int(tokens_seen)
        if step is None:
            step = self._step - 1 if self._step else None
        elif type(step) is not int or step < 0:
            raise LogError(f"step {step!r} is not an integer >= 0")
        with _Deferred.signals():
            self._sink.emit_dict("checkpoint", payload, step)
        return payload

    def _config_changed(self, changes: dict) -> None:
        if not self.finished:
            self._record("config", {"config": changes})

    @property
    def _producer(self) -> str:
        return getattr(self._sink, "producer", None) or PRODUCER

    # -- the end

    def finish(self, status: str | None = None, exit_code: int | None = None, reason: str | None = None,
               quiet: bool | None = None, timeout: float = FINISH_TIMEOUT_S, wait: bool | None = None) -> bool:
        """Record `run_finished` (completed, failed or stopped; exit_code != 0 is failed) with the summary.

        On the root's local server (the default) it returns once every event is fsync'd in the spool and
        the chain is freed for the root's supervisor, which stores what is left (`runledger sql`, `ui`
        and `verify` on the root wait for it, or say it is still being stored): True. With `wait=True`
        (or $RUNLEDGER_FINISH_WAIT=1), and always with a server of $RUNLEDGER_NATS, it waits up to
        `timeout` for the ledger to confirm it stored the run's events: True if it did."""
        if self.finished:
            return True
        status = status or ("failed" if exit_code else "completed")
        if status not in ("completed", "failed", "stopped"):
            raise LogError(f"status {status!r}: completed, failed or stopped")
        if self._pending is not None:
            self._commit()
        if self._console is not None:
            self._console.stop()  # (its last lines sent; the streams put back)
        self._save_at_end()
        if self._sampler is not None:
            self._sampler.stop()
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self.finished = True
        summary = {k: v for k, v in {k: _json_value(v) for k, v in self.summary.items()}.items()
                   if v is None or isinstance(v, (int, float, str, bool))}
        summary = dict(list(summary.items())[-MAX_METRICS:])
        loss = summary.get("loss", summary.get("train/loss"))
        payload = {"status": status, "summary": {k: (None if isinstance(v, float) and v - v != 0.0 else v)
                                                  for k, v in summary.items()}}
        if self._step:
            payload["final_step"] = self._step - 1
        if isinstance(loss, float) and loss - loss == 0.0:
            payload["final_loss"] = loss
        if reason:
            payload["reason"] = reason[:2000]
        self._sink.emit_dict("run_finished", payload, self._step - 1 if self._step else None)
        if self._offline and not (isinstance(self._sink, Emitter) and self._sink.publisher.connected_once):
            timeout = 0.0  # its server never answered: the events are in the spool, as init said
        if wait is None:
            wait = os.environ.get(FINISH_WAIT_ENV, "") not in ("", "0")
        if isinstance(self._sink, Emitter) and self._attachment is not None and not wait:
            self._sink.hand_over()  # fsync'd; the root's supervisor sends and stores the rest
            ok = True
        elif isinstance(self._sink, Emitter):
            ok = self._sink.close(timeout, not self._offline)
        else:
            ok = self._sink.close()
        if self._attachment is not None:
            self._attachment.release()
        Current.finished(self)
        if not ok and not self._offline:
            log.warning("run %s: the ledger has not confirmed every event yet; they stay in the spool and are sent later",
                        self.run_id)
        return ok

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish()
        elif issubclass(exc_type, KeyboardInterrupt):
            self.finish("stopped", reason=_Deferred.reason or "KeyboardInterrupt")
        else:
            self.finish("failed", reason=f"{exc_type.__name__}: {exc}")

    def __repr__(self) -> str:
        return f"<runledger Run {self.run_id} attempt {self.attempt} at step {self._step}>"


class _Deferred:
    """SIGINT and SIGTERM raise KeyboardInterrupt in the main thread, but not inside an emit, where a
    half-written spool line would be left: there they wait until the emit is done."""

    depth = 0
    pending: int | None = None
    reason: str | None = None
    installed: dict = {}

    class signals:
        def __enter__(self) -> None:
            _Deferred.depth += 1

        def __exit__(self, *exc) -> None:
            _Deferred.depth -= 1
            if _Deferred.depth == 0 and _Deferred.pending is not None:
                signum, _Deferred.pending = _Deferred.pending, None
                _Deferred.raise_for(signum)

    @staticmethod
    def handler(signum: int, frame) -> None:
        if _Deferred.depth:
            _Deferred.pending = signum
        else:
            _Deferred.raise_for(signum)

    @staticmethod
    def raise_for(signum: int) -> None:
        _Deferred.reason = signal.Signals(signum).name
        raise KeyboardInterrupt(_Deferred.reason)

    @staticmethod
    def install() -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
            if signal.getsignal(signum) is default:  # a handler of the user's own stays
                _Deferred.installed[signum] = default
                signal.signal(signum, _Deferred.handler)

    @staticmethod
    def uninstall() -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, default in _Deferred.installed.items():
            if signal.getsignal(signum) is _Deferred.handler:
                signal.signal(signum, default)
        _Deferred.installed.clear()


class Current:
    """The process's current run (`runledger.run`), and the hooks that finish it if the script ends first."""

    run: Run | None = None
    exc: tuple | None = None
    _hooked = False

    @classmethod
    def started(cls, run: Run) -> None:
        if cls.run is not None and not cls.run.finished:
            cls.run.finish()  # (W&B's reinit: the previous run ends)
        cls.run, cls.exc = run, None
        if not cls._hooked:
            cls._hooked = True
            previous = sys.excepthook

            def excepthook(tp, value, tb):  # an uncaught exception: atexit then finishes the run as failed
                cls.exc = (tp, value)
                previous(tp, value, tb)

            sys.excepthook = excepthook
            atexit.register(cls.at_exit)
        _Deferred.install()

    @classmethod
    def finished(cls, run: Run) -> None:
        if cls.run is run:
            cls.run = None
            _Deferred.uninstall()

    @classmethod
    def at_exit(cls) -> None:
        run = cls.run
        if run is None or run.finished:
            return
        if cls.exc is None:
            run.finish()
        elif issubclass(cls.exc[0], KeyboardInterrupt):
            run.finish("stopped", reason=_Deferred.reason or "KeyboardInterrupt")
        else:
            run.finish("failed", reason=f"{cls.exc[0].__name__}: {cls.exc[1]}")


def _check_loss_unit(config: dict) -> None:
    """A LogError unless config's loss_unit (if any) is a known unit and its bytes_per_token a positive number."""
    unit = config.get("loss_unit")
    if unit is not None and unit not in LOSS_UNITS:
        raise LogError(f"loss_unit={unit!r}: one of {', '.join(LOSS_UNITS)}")
    bpt = config.get("bytes_per_token")
    if bpt is not None and (isinstance(bpt, bool) or not isinstance(bpt, (int, float)) or not 0 < bpt < float("inf")):
        raise LogError(f"bytes_per_token={bpt!r}: a positive number (the bytes of text per token of the loss's tokenizer)")


def init(project: str | None = None, name: str | None = None, config: dict | Any = None, tags: list[str] | None = None,
         resume: bool | str | None = None, id: str | None = None, *, root: str | Path | None = None,
         nats: str | None = None, producer: str = PRODUCER, system_metrics: bool | float = True,
         thresholds: dict[str, float] | None = None, mode: str | None = None, resumed_from: dict | None = None,
         console: bool | None = None, health: str | None = None, loss_unit: str | None = None,
         bytes_per_token: float | None = None, **ignored: Any) -> Run:
    """Start a run (or, with `resume`, the run's next attempt) and make it the current one.

    project, config, tags: as W&B's. name: the run's display name, not unique (any number of runs may
        have it; `runledger report NAME` and the other commands take it where one run has it).
    id: the run's id; else every `init` starts a new run with a fresh id made of the name
        ("my-run-k3x9q2ab"), as W&B and Trackio do, so a script runs again as often as you like.
    resume: with `id`: None/False/"never" refuse a run that exists; True/"allow"/"auto" go on with it as
        its next attempt if it exists; "must" requires it. With a name and no id, True/"allow"/"auto"/
        "must" go on with the one run of that name in that project (a run stored before names were kept
        has its name made an id as its id, and is found so), and a new run is started where there is
        none ("must": an error) or several (a warning; "must": an error naming them). A resumed run first
        sends what its last attempt left in the spool, and `log` counts on from the last step it logged.
    root: the ledger root ($RUNLEDGER_ROOT, else this user's: `runledger.ledger.settings.user_root`);
        nats: a server URL instead of the root's embedded one ($RUNLEDGER_NATS, or $RUNLEDGER_CREDS for
        a secured server).
    system_metrics: sample the machine every 10 s (a number: every that many seconds); False: never.
    console: record what the script writes to stdout and stderr, line by line, as `console` events (the default,
        as W&B does; False, or W&B's settings console="off": not): `runledger.console`.
    health: the health profile ("marin", "marin-2024"; queries/thresholds.py), recorded as config["health"].
    loss_unit: what the logged loss is averaged over: "token", "byte", "sample" or "other" (config["loss_unit"]);
        Marin's profile holds only a per-token loss to its absolute loss numbers. bytes_per_token: for a
        per-byte loss, its tokenizer's bytes per token, which converts them (config["bytes_per_token"]).
    thresholds: overrides of the health checks' thresholds (`runledger audit health`), by name
        (queries/thresholds.py: e.g. {"grad_norm_max": 5.0, "block_steps": 20}).
    resumed_from: the checkpoint this attempt goes on from, {"path", "step", "content_hash"} (as
        `log_checkpoint` recorded it): in `run_started`, where the `checkpoint_lineage` audit matches it.
    fork_from: "RUN?_step=N" (W&B's; or "RUN@STEP"): a new run whose history is RUN's up to step N, logging on
        from N + 1; resume_from: the same point of the run itself, rewound as its next attempt from N + 1
        (the steps it logged after N no longer count). Both in `run_started` (runledger.queries.forks).
    mode: "online", "offline" or "disabled" (else settings=Settings(mode=...), $RUNLEDGER_MODE, $WANDB_MODE):
        "disabled" records nothing and starts nothing (every call still works).
    group, job_type, notes: W&B's, recorded in `run_started` (columns of the `runs` view). Other W&B
    arguments (entity, dir, reinit, settings, ...) are accepted. init says on stderr, in one line, the run id, the root and
    where to look (unless $RUNLEDGER_SILENT or $WANDB_SILENT is set, or settings' silent).
    """
    try:
        mode = mode_of(mode, ignored.get("settings"))
    except ValueError as err:
        raise LogError(str(err)) from None
    if resume not in _RESUME:
        raise LogError(f"resume={resume!r}: True, False, 'allow', 'must' or 'never'")
    if config is not None and not isinstance(config, dict):
        config = vars(config) if hasattr(config, "__dict__") else dict(config)
    config = dict(config or {})
    if health is not None:  # the health profile the audits and agents hold the run to (queries/thresholds.py)
        if health not in PROFILES:
            raise LogError(f"health={health!r}: one of {', '.join(PROFILES)}")
        config["health"] = health
    config.update({k: v for k, v in (("loss_unit", loss_unit), ("bytes_per_token", bytes_per_token)) if v is not None})
    _check_loss_unit(config)
    labels = {k: str(v) for k, v in (("name", name), ("group", ignored.get("group")),
                                     ("job_type", ignored.get("job_type"))) if v is not None and str(v) != ""}
    for k, v in labels.items():
        if len(v) > MAX_LABEL or _BAD_NAME.search(v):
            raise LogError(f"{k} {v[:40]!r}: at most {MAX_LABEL} characters on one line")
    if ignored.get("notes") is not None:
        labels["notes"] = str(ignored["notes"])
    name = labels.get("name")
    unknown = sorted(map(str, set(thresholds or ()) - NAMES))
    if unknown:
        raise LogError(f"unknown thresholds {', '.join(unknown)} (known: {', '.join(sorted(NAMES))})")
    if resumed_from:  # (refused before anything starts)
        try:
            resumed_from = {"path": str(resumed_from["path"]), "step": int(resumed_from["step"]),
                            "content_hash": str(resumed_from["content_hash"])}
        except (KeyError, TypeError, ValueError) as err:
            raise LogError(f"resumed_from {str(resumed_from)[:80]}: a dict of path, step (a whole number) and "
                           f"content_hash ({type(err).__name__}: {err})") from None
    root = Path(settings.root(root))
    how, point = None, None
    if ignored.get("fork_from") or ignored.get("resume_from"):  # its point in the ledger, found before anything starts
        from runledger.ledger.storing import wait_stored

        wait_stored(root)  # (a parent that finished a moment ago: stored first)
        try:
            how, point, id, resume = _forks().start_of(root, ignored, id, resume, mode != "disabled")
        except ValueError as err:
            raise LogError(str(err)) from None
    fresh = id is None  # a new id: no chain of it exists anywhere, so attempt 0 is its own
    if id is not None:
        run_id = str(id)
    elif mode == "disabled":
        run_id = new_run_id(name, project)
    else:
        run_id, fresh = _which_run(root, name, project, resume)
    if not NAME_RE.fullmatch(run_id):
        raise LogError(f"run id {run_id!r}: 1-64 of a-z 0-9 _ - starting with a letter or digit")
    if mode == "disabled":
        run = Run(run_id, project=project, name=name, root=root, sink=NullSink(), attempt=0, config=config,
                  tags=list(tags or []), first_step=0, attachment=None, mode=mode, entity=ignored.get("entity"))
        Current.started(run)
        return run
    remote = nats or os.environ.get(settings.NATS_ENV) or os.environ.get(settings.CREDS_ENV)
    url = settings.nats_url(nats) if remote and mode != "offline" else None
    offline = f"mode={mode}" if mode == "offline" else ""  # why this run is spooled only, at first
    if url is not None and not bus.reachable(url, REACH_S):
        offline = f"nothing answers at {redact(url)}"
    attachment = None if remote or offline else local.attach(root, wait=False)  # (never waits for the server)
    url = attachment.url if attachment else url
    spool = settings.spool_dir(root)
    attempt = None
    asked = producer
    try:
        spooled = (spool / run_id).exists()  # (before the claim below makes a folder there)
        if fresh:  # a new id: no chain of it anywhere, attempt 0 claimed under the root
            attempt = claim_attempt(spool, run_id, producer, 0)
        elif attachment is not None:  # the root's own ledger stores under the root: its files and spool say
            attempt = next_attempt(run_id, producer, spool, root=root)  # (claimed: concurrent starts get two)
        else:
            attempt, producer = _attempt(run_id, producer, spool, None if offline else url, REMOTE_LEDGER_WAIT_S)
        exists = attempt > 0 or spooled or (producer != asked and _stored(root, run_id))
        if exists and resume in (None, False, "never"):
            raise LogError(f"run {run_id!r} exists; pass resume=True to go on with it, or another name")
        if not exists and resume == "must" and producer == asked:
            raise LogError(f"run {run_id!r} does not exist, and resume='must'")
        first_step = 0
        if exists:
            if not offline and attachment is None:  # (the root's supervisor sends a local run's leftovers)
                send_leftovers(spool, url, run_id)
            last = _last_step(root, spool, run_id)
            first_step = 0 if last is None else last + 1
        first_step = point["step"] + 1 if point else first_step
        sink = Emitter(run_id, producer, attempt, None if mode == "offline" else url, spool)
    except BaseException:
        if attempt is not None:
            with contextlib.suppress(OSError):  # the attempt claimed and never started is free again
                chain_dir(spool, run_id, producer, attempt).rmdir()
        if attachment is not None:
            attachment.release()
        raise
    interval = None if system_metrics is False else (10.0 if system_metrics is True else float(system_metrics))
    run = Run(run_id, project=project, name=name, root=root, sink=sink, attempt=attempt, config=config,
              tags=[str(t) for t in tags or []], first_step=first_step, attachment=attachment, mode=mode,
              entity=ignored.get("entity"))
    started = {"config": dict(run.config), "config_hash": hashlib.sha256(canonical_json(dict(run.config)).encode()).hexdigest(),
               "tags": run.tags, "hardware": {**origin(producer), "python": platform.python_version(),
                                              "platform": platform.platform(), "cpus": os.cpu_count()},
               "heartbeat_s": (beat_s := heartbeat_interval_s())}
    if project:
        started["project"] = str(project)
    started.update(labels)  # name, group, job_type, notes: those given
    if thresholds:
        started["thresholds"] = {k: float(v) for k, v in thresholds.items()}
    if resumed_from:
        started["resumed_from"] = resumed_from
    if point:
        started[how] = point
    if commit := _code_commit():
        started["code_commit"] = commit
    sink.emit_dict("run_started", started, first_step if first_step else None)
    run._config_hash = started["config_hash"]
    if interval:
        run._sampler = SystemSampler(sink, interval, root).start()
    run._heartbeat = Heartbeat(sink, beat_s).start()  # (system_metrics=False or not: liveness is not a metric)
    run._offline = bool(offline)
    if offline or producer != asked:
        _say_offline(run, offline, bool(remote), producer != asked)
    Current.started(run)
    if not silent(ignored.get("settings")):
        print(where_line(run), file=sys.stderr, flush=True)  # (W&B's "View run at": a user's line, not a log record)
    if console_wanted(console, ignored.get("settings")):
        run._console = Console(run).start()  # the script's stdout and stderr as `console` events
    return run


def _forks():
    from runledger.queries import forks  # (DuckDB: only for a fork or a rewind)

    return forks


def _attempt(run_id: str, producer: str, spool: Path, url: str | None, wait_s: float) -> tuple[int, str]:
    """(attempt, producer) of a run given by its id: the ledger's next attempt (claimed) when a ledger at
    `url` answers within `wait_s`; else (offline, `url` None, or no ledger) attempt 0 of a producer name made
    for this process (`{producer}-offline-{random}`), which no chain anywhere can hold: an attempt guessed
    from this machine alone might be one another machine already took."""
    if url is not None:
        try:
            return next_attempt(run_id, producer, spool, nats_url=url, wait_s=wait_s), producer  # claimed
        except RuntimeError as err:  # no ledger answers
            log.debug("%s", err)
    own = f"{producer[:40]}-offline-{secrets.token_hex(4)}"
    return claim_attempt(spool, run_id, own, 0), own


def _stored(root: Path, run_id: str) -> bool:
    """Whether the ledger under `root` holds events of the run (read from its files, not asked)."""
    from runledger.ledger.storage.reads import read_events  # (pyarrow: only for a run given by id, offline)

    try:
        return read_events(root, run_id=run_id, columns=["seq"]).num_rows > 0
    except (OSError, ValueError):
        return False


def _say_offline(run: Run, why: str, remote: bool, own_producer: bool) -> None:
    """The one line that says where an offline run's events are and how they get sent."""
    chain = f" as producer {run._producer}, attempt 0 (the attempt number is the ledger's to say)" if own_producer else ""
    if not why:  # the server answers but no ledger does: the events are published all the same
        print(f"runledger: no ledger answered: run {run.run_id} goes on{chain}", file=sys.stderr, flush=True)
        return
    sync = f"`runledger sync --root {run.root}" + (" --nats URL`" if remote else "`")
    if not remote:
        when = f"by the root's ledger at the next online init on this root, or by {sync}"
    else:
        when = ("as soon as the server answers, else by " if why != "mode=offline" else "by ") + sync
    print(f"runledger: offline ({why}): run {run.run_id} is kept in {settings.spool_dir(run.root) / run.run_id}{chain}; "
          f"it is sent {when}", file=sys.stderr, flush=True)
