"""The W&B (and Trackio) calls a script already makes beyond init/log/finish, so that it runs with only its import
changed: each either works or does nothing with one warning naming what it skipped, never an exception.

Work: `save` and `log_artifact` (each file's path, SHA-256 and size recorded as an `artifact` event),
`Artifact`, `run.url` (the run's page on the dashboard), `run.dir` (a folder of the run's under the root),
`run.path`, `run.entity`, `config.as_dict()`, `define_metric` (the summary it asks for; `step_metric` kept in
the config's `_wandb` key as the dashboard's x axis), `Settings` (init reads `mode` and `silent`), `alert`.
`Table`, `Image`, `Histogram`, `Audio`, `Video`, `Html` and `Object3D` are `runledger.values`' (stored as events of
their own). Skip, warning once:
`plot.*` values in `log`, `watch`, `use_artifact`, `sweep`, `login`, `run.log_code`, `run.mark_preempting`, `alert(webhook_url=)`
(webhooks are `runledger notify`'s). The warnings go to the `runledger` logger (a warning, not a Python
`warnings` category: a test suite run with `-W error` must not turn a skipped call into an exception),
once per name per process.

Only the standard library here: `runledger.core` imports this module, and `import runledger` loads neither.
"""

from __future__ import annotations

import fnmatch
import getpass
import glob
import hashlib
import logging
import os
import shlex
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger("runledger")

WARNED: set[str] = set()  # the names warned about in this process (each once)
MODES = {"online": "online", "run": "online", "offline": "offline", "dryrun": "offline", "disabled": "disabled"}
SUMMARIES = ("min", "max", "mean", "last", "first", "best", "none")
GOALS = {None: None, "min": "minimize", "max": "maximize", "minimize": "minimize", "maximize": "maximize"}
RUN_PAGE = "#/run/"  # the dashboard's page of one run (ui/static/app.js routes it)
_TRUE = ("1", "true", "yes", "on")


def skipped(name: str, why: str) -> None:
    """Warn once per process that `name` did nothing, and why."""
    if name not in WARNED:
        WARNED.add(name)
        log.warning("%s: %s (skipped; said once)", name, why)


# -- init's settings: mode, and whether to say where the run is


class Settings:
    """W&B's `wandb.Settings(...)`: any settings, read as attributes (None where not given). `init(settings=)`
    reads `mode` and `silent` / `quiet`; the rest are accepted and have no effect here."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    def update(self, settings: Any = None, **kwargs: Any) -> None:
        self.__dict__.update(dict(settings or {}), **kwargs)

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


def _setting(settings: Any, name: str) -> Any:
    if isinstance(settings, dict):
        return settings.get(name)
    return getattr(settings, name, None) if settings is not None else None


def mode_of(mode: str | None, settings: Any = None) -> str:
    """online, offline or disabled: `mode=`, else the settings' mode, else $RUNLEDGER_MODE, else $WANDB_MODE
    (W&B's names: "run" is online, "dryrun" offline)."""
    given = mode or _setting(settings, "mode") or os.environ.get("RUNLEDGER_MODE") or os.environ.get("WANDB_MODE")
    if not given:
        return "online"
    if str(given).lower() not in MODES:
        raise ValueError(f"mode {given!r}: online, offline or disabled")  # (init raises it as its LogError)
    return MODES[str(given).lower()]


def silent(settings: Any = None) -> bool:
    """Whether init says nothing: $RUNLEDGER_SILENT or $WANDB_SILENT set, or settings' silent or quiet."""
    env = any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("RUNLEDGER_SILENT", "WANDB_SILENT", "WANDB_QUIET"))
    return env or bool(_setting(settings, "silent")) or bool(_setting(settings, "quiet"))


def where_line(run: Any) -> str:
    """init's one line: the run id, the root, and where to look (no token: job logs are shared)."""
    from runledger.ledger import settings

    name = f" ({run.name})" if run.name and run.name != run.run_id else ""
    root = Path(run.root).resolve()
    served = settings.dashboard_url(root)
    if served:
        look = f"view it at {served}{RUN_PAGE}{run.run_id}"
    else:
        look = f"view it with: runledger ui --root {shlex.quote(str(root))}"
    return f"runledger: run {run.run_id}{name} logging to {root}; {look}"


# -- values `log` accepts and skips (a later version stores them)


class Media:
    """A W&B value that is not a number and not stored (a chart): `log` accepts it and skips it, warning once
    per type."""

    warn_in_log = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args, self._kwargs = args, kwargs


class Chart(Media):
    """What `plot.*` returns: `log` skips it without a second warning (`plot.NAME` warned already)."""

    warn_in_log = False


class _Plots:
    """`wandb.plot.line(...)`, `.scatter`, `.bar`, `.histogram`, `.line_series`, `.confusion_matrix`,
    `.pr_curve`, `.roc_curve`, ...: each warns once and returns a Chart that `log` skips."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def chart(*args: Any, **kwargs: Any) -> Chart:
            skipped(f"plot.{name}", "charts are not stored yet: the dashboard draws every metric logged")
            return Chart(*args, **kwargs)

        return chart


plot = _Plots()


def skipped_value(name: str, value: Any) -> None:
    """`log` met a value it cannot store (under metric `name`): warn once per kind of value."""
    if isinstance(value, Media):
        if value.warn_in_log:
            skipped(type(value).__name__, f"a {type(value).__name__} logged (as {name!r}) is not stored yet")
    else:
        kind = type(value).__name__
        skipped(f"log of a {kind}", f"{name!r} holds a {kind}: not a number, Histogram, Table, Image or File; not stored")


# -- files: save, artifacts


def file_facts(path: Path) -> dict:
    """A file's absolute path, SHA-256 and size, as an `artifact` event records them."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"path": str(path.resolve()), "sha256": digest, "bytes": path.stat().st_size}


class Artifact:
    """`wandb.Artifact(name, type, description=None, metadata=None, incremental=False, use_as=None)`: the files
    added (add_file, add_dir) are recorded by `log_artifact`, each with its SHA-256; references (add_reference)
    are skipped."""

    def __init__(self, name: str, type: str, description: str | None = None, metadata: dict | None = None,
                 incremental: bool = False, use_as: str | None = None, **kwargs: Any) -> None:
        self.name, self.type, self.description = str(name), str(type), description
        self.metadata = dict(metadata or {})
        self.aliases: list[str] = []
        self.files: list[Path] = []

    def add_file(self, local_path: str, name: str | None = None, is_tmp: bool | None = False, skip_cache: bool | None = False,
                 policy: str | None = "mutable", overwrite: bool = False) -> None:
        path = Path(local_path)
        if not path.is_file():
            skipped(f"Artifact.add_file {local_path}", "no such file")
            return
        self.files.append(path)

    def add_dir(self, local_path: str, name: str | None = None, skip_cache: bool | None = False,
                policy: str | None = "mutable", merge: bool = False) -> None:
        self.files += sorted(p for p in Path(local_path).rglob("*") if p.is_file())

    def add_reference(self, uri: str, name: str | None = None, checksum: bool = True, max_objects: int | None = None) -> None:
        skipped("Artifact.add_reference", "references are not recorded: add the files themselves")

    def new_file(self, name: str, mode: str = "x", encoding: str | None = None):
        folder = Path(tempfile.mkdtemp(prefix="runledger-artifact-"))
        self.files.append(folder / name)
        return open(folder / name, mode, encoding=encoding)

    def download(self, root: str | None = None, *args: Any, **kwargs: Any) -> str:
        skipped("Artifact.download", "artifacts are not stored, so nothing is downloaded")
        return str(root or tempfile.mkdtemp(prefix="runledger-artifact-"))

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: `log_artifact` records the files."""

    def wait(self, *args: Any, **kwargs: Any) -> "Artifact":
        return self

    def __repr__(self) -> str:
        return f"<runledger Artifact {self.name} ({self.type}), {len(self.files)} files>"


# -- the module's calls that need no run


def watch(models: Any = None, criterion: Any = None, log: str | None = "gradients", log_freq: int = 1000,
          idx: int | None = None, log_graph: bool = False) -> None:
    skipped("watch", "gradients and parameters are not recorded: log the norms you want with runledger.log")


def unwatch(models: Any = None) -> None:
    skipped("unwatch", "nothing is watched")


def login(anonymous: str | None = None, key: str | None = None, relogin: bool | None = None, host: str | None = None,
          force: bool | None = None, timeout: int | None = None, verify: bool = False, referrer: str | None = None,
          **kwargs: Any) -> bool:
    skipped("login", "runledger needs no account (its ledger is local, or $RUNLEDGER_NATS)")
    return True


def sweep(sweep: Any = None, entity: str | None = None, project: str | None = None, prior_runs: Any = None, **kwargs: Any) -> str:
    skipped("sweep", "sweeps are not run by runledger")
    return "runledger-no-sweep"


# -- a run's calls (`runledger.core.Run` takes these as a base)


class WandbRun:
    """The W&B calls of a run beyond log/finish: url, dir, path, entity, save, log_artifact, define_metric and
    the skipped ones. Uses the run's `run_id`, `project`, `root`, `summary`, `config`, `_record(kind, payload)`."""

    entity: str | None = None
    _dir: Path | None = None
    _saved_at_end: list = []
    _defined: dict | None = None  # name or pattern -> (summary modes, goal): define_metric's

    # -- where the run is

    @property
    def url(self) -> str | None:
        """The run's page on the dashboard: of a `runledger ui` serving this root if one runs (it writes its
        address under the root), else where the default `runledger ui --root ROOT` serves it."""
        from runledger.ledger import settings

        if self._disabled:
            return None
        return f"{settings.dashboard_url(self.root) or settings.default_dashboard_url()}{RUN_PAGE}{self.run_id}"

    def get_url(self) -> str | None:
        return self.url

    @property
    def dir(self) -> str:
        """A folder of the run's own (`{root}/files/{run_id}`; a temporary one when disabled), made on first use."""
        if self._dir is None:
            if self._disabled:
                self._dir = Path(tempfile.mkdtemp(prefix=f"runledger-{self.run_id}-"))
            else:
                self._dir = Path(self.root) / "files" / self.run_id
                self._dir.mkdir(parents=True, exist_ok=True)
        return str(self._dir)

    @property
    def path(self) -> str:
        """entity/project/run_id, as W&B's run.path."""
        return f"{self.entity or default_entity()}/{self.project or 'uncategorized'}/{self.run_id}"

    @property
    def _disabled(self) -> bool:
        return getattr(self, "mode", "online") == "disabled"

    # -- files

    def save(self, glob_str: str | os.PathLike | None = None, base_path: str | os.PathLike | None = None,
             policy: str = "live") -> list[str]:
        """Record each file `glob_str` matches (path, SHA-256, size) as an `artifact` event: now, or with
        policy="end" when the run finishes. Returns the files' paths."""
        if glob_str is None:
            return []
        pattern = os.fspath(glob_str)
        if policy == "end":
            self._saved_at_end = [*self._saved_at_end, pattern]
            return []
        return [self._record_file(Path(p), via="save") for p in sorted(glob.glob(pattern, recursive=True))
                if Path(p).is_file()] or self._nothing_matched(pattern)

    def _nothing_matched(self, pattern: str) -> list:
        skipped(f"save {pattern}", "no file matches it")
        return []

    def _save_at_end(self) -> None:
        for pattern in self._saved_at_end:
            self.save(pattern)

    def log_artifact(self, artifact_or_path: "Artifact | str | os.PathLike", name: str | None = None,
                     type: str | None = None, aliases: list[str] | None = None, tags: list[str] | None = None) -> Artifact:
        """Record each file of the artifact (or the file or folder at a path) as an `artifact` event."""
        artifact = artifact_or_path
        if not isinstance(artifact, Artifact):
            path = Path(os.fspath(artifact_or_path))
            artifact = Artifact(name or path.name, type or "unspecified")
            if path.is_dir():
                artifact.add_dir(str(path))
            else:
                artifact.add_file(str(path))
        artifact.aliases = list(aliases or [])
        for f in artifact.files:
            self._record_file(f, via="log_artifact", name=artifact.name, type=artifact.type)
        return artifact

    def _record_file(self, path: Path, via: str, name: str | None = None, type: str | None = None) -> str:
        facts = file_facts(path)
        self._record("artifact", {**facts, "via": via, **({"name": name} if name else {}), **({"type": type} if type else {})})
        return facts["path"]

    def use_artifact(self, artifact_or_name: Any, type: str | None = None, aliases: list[str] | None = None,
                     use_as: str | None = None) -> Artifact:
        skipped("use_artifact", "artifacts are not stored, so none is fetched")
        if isinstance(artifact_or_name, Artifact):
            return artifact_or_name
        return Artifact(str(artifact_or_name).split(":")[0].rsplit("/", 1)[-1], type or "unspecified")

    def link_artifact(self, *args: Any, **kwargs: Any) -> None:
        skipped("link_artifact", "there is no model registry")

    # -- skipped

    def watch(self, *args: Any, **kwargs: Any) -> None:
        watch(*args, **kwargs)

    def unwatch(self, *args: Any, **kwargs: Any) -> None:
        unwatch(*args, **kwargs)

    def log_code(self, root: str | None = ".", name: str | None = None, include_fn: Any = None, exclude_fn: Any = None,
                 **kwargs: Any) -> None:
        skipped("log_code", "the code is not copied; run_started records the git commit (code_commit)")

    def mark_preempting(self) -> None:
        skipped("mark_preempting", "a run stopped by a signal is recorded as stopped; resume it with init(id=..., resume=True)")

    # -- define_metric and the summary it asks for

    def define_metric(self, name: str, step_metric: str | None = None, step_sync: bool | None = None,
                      hidden: bool | None = None, summary: str | None = None, goal: str | None = None,
                      overwrite: bool | None = None, **kwargs: Any) -> None:
        """W&B's define_metric: `summary` ("min", "max", "mean", "last", "first", "best" with `goal`, "none",
        or several joined by commas) is what the run's summary holds for the metric (one: under its name;
        several: under "NAME.MODE" each); `step_metric` is kept as its x axis. `name` may hold wildcards ("val/*")."""
        modes = [m.strip().lower() for m in (summary or "").split(",") if m.strip()]
        bad = [m for m in modes if m not in SUMMARIES]
        if bad or goal not in GOALS:
            skipped(f"define_metric({name!r})", f"summary {summary!r} or goal {goal!r}: "
                    f"summary one of {', '.join(SUMMARIES)}; goal minimize or maximize")
            modes = [m for m in modes if m in SUMMARIES]
        spec = {k: v for k, v in (("step_metric", step_metric), ("summary", ",".join(modes) or None),
                                  ("goal", GOALS.get(goal)), ("hidden", hidden)) if v is not None}
        if modes:
            self._defined = {**(self._defined or {}), str(name): (modes, GOALS.get(goal))}
            self._aggregates = getattr(self, "_aggregates", {})
        if spec:
            wandb = dict(self.config.get("_wandb") or {})
            wandb["define_metric"] = {**wandb.get("define_metric", {}), str(name): spec}
            self.config.update({"_wandb": wandb})

    def _modes_of(self, name: str) -> tuple | None:
        defined = self._defined
        if name in defined:
            return defined[name]
        for pattern, spec in defined.items():
            if ("*" in pattern or "?" in pattern) and fnmatch.fnmatchcase(name, pattern):
                return spec
        return None

    def _summarize(self, values: dict) -> None:
        """The summary after a log of `values` (name -> number, string or None): each name's last value, or what
        define_metric asked for."""
        summary = self.summary
        if self._defined is None:
            summary.update(values)
            return
        aggregates = self._aggregates
        for name, v in values.items():
            spec = self._modes_of(name)
            if spec is None:
                summary[name] = v
                continue
            modes, goal = spec
            a = aggregates.setdefault(name, {"n": 0, "sum": 0.0})
            number = isinstance(v, float) and v - v == 0.0
            a["last"] = v
            a.setdefault("first", v)
            if number:
                a["n"] += 1
                a["sum"] += v
                a["min"] = v if a.get("min") is None else min(a["min"], v)
                a["max"] = v if a.get("max") is None else max(a["max"], v)
            for mode in modes:
                key = name if len(modes) == 1 else f"{name}.{mode}"
                if mode == "none":
                    summary.pop(key, None)
                elif mode == "mean":
                    summary[key] = a["sum"] / a["n"] if a["n"] else None
                elif mode == "best":
                    summary[key] = a.get("max" if goal == "maximize" else "min")
                else:
                    summary[key] = a.get(mode)


def default_entity() -> str:
    """W&B's entity (a user or team): here the OS user."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "user"

