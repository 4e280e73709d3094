"""`runledger.Api`: the runs of a root, or of a dashboard, read back in Python, every point, no sampling.

    api = runledger.Api()                                     # the default root ($RUNLEDGER_ROOT, else the user's)
    api = runledger.Api(root="/data/ledger")
    api = runledger.Api(url="http://host:8765/", token=T)     # a `runledger ui` (its read token)
    for run in api.runs({"project": "mnist", "tags": "baseline"}):
        print(run.id, run.name, run.state, run.config["lr"], run.summary.get("train/loss"))
    table = api.run("run-id-or-name").history(["train/loss"], steps=(0, 999))    # Arrow; format="pandas"|"polars"

`history` is `runledger.queries.history` (see there): a row per `runledger.log` call that holds one of the
keys, each step from the latest attempt that logged it unless `attempt=` names one. From a dashboard it
comes in pages of `/api/history` (bounded, with a cursor) and is put together here. The W&B calls a script
makes keep working: `Api(overrides=, timeout=, api_key=)`, `runs("entity/project")` (the runs of that project),
`run("entity/project/run_id")`, `run.history(keys=, samples=)` (every point: `samples` is ignored).
What a bad call gets is `ApiError`, one line.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

FORMATS = ("arrow", "pandas", "polars")
PAGE_ROWS = 50_000  # rows asked of a dashboard per page (it bounds them at runledger.queries.history.MAX_PAGE)


class ApiError(ValueError):
    """A read the Api refuses or could not make; the message is the one-line reason."""


class Api:
    """The runs of a root (`root`, default the one `runledger.init` logs to) or of a dashboard (`url`, with its
    read `token` where it has one). See the module docstring."""

    def __init__(self, root: str | Path | None = None, *, url: str | None = None, token: str | None = None,
                 overrides: dict | None = None, timeout: float | None = None, api_key: str | None = None) -> None:
        from runledger.ledger import settings

        if isinstance(root, dict):  # (W&B's Api(overrides) as its first argument: W&B's settings, none of them ours)
            root = None
        if url is not None and root is not None:
            raise ApiError("give root= or url=, not both")
        self.timeout = float(timeout or 60.0)
        self.url, self.token = None, token or api_key
        self.root: Path | None = None
        if url is not None:
            parsed = urllib.parse.urlsplit(url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc:
                raise ApiError(f"url {url[:100]!r} is not a dashboard's http(s) address")
            self.url = f"{parsed.scheme}://{parsed.netloc}{parsed.path.rstrip('/')}"
            if parsed.query:
                token_given = urllib.parse.parse_qs(parsed.query).get("token")
                self.token = self.token or (token_given[0] if token_given else None)
        else:
            self.root = Path(settings.root(root)).expanduser()

    def __repr__(self) -> str:
        return f"Api({'url=' + repr(self.url) if self.url else 'root=' + repr(str(self.root))})"

    # -- runs

    def runs(self, path: str | dict | None = None, filters: dict | None = None, **_: Any) -> list[Run]:
        """The runs passing `filters` (see runledger.queries.history.matches: {"project": P, "state": S,
        "tags": T, "config.KEY": V, ...}), in start order; a W&B path "entity/project" keeps that project's."""
        if isinstance(path, dict):
            path, filters = None, path
        filters = dict(filters or {})
        if isinstance(path, str) and path:
            filters.setdefault("project", path.split("/")[-1])
        if self.url is not None:
            rows = self._get("/api/history/runs", {"filters": json.dumps(filters)})["runs"]
        else:
            rows = self._local(lambda h: h.runs(self.root, filters))
        return [Run(self, row) for row in rows]

    def run(self, run: str) -> Run:
        """One run by its id or name (a W&B path "entity/project/run_id" names its last part)."""
        if not isinstance(run, str) or not run:
            raise ApiError("run is a run's id or name")
        wanted = run.split("/")[-1]
        runs = self.runs()
        found = [r for r in runs if r.id == wanted] or [r for r in runs if r.name == wanted]
        if not found and self.root is not None and self._local(lambda h: _has_events(self.root, wanted)):
            found = [Run(self, {"run_id": wanted})]  # (events, but no run_started: a stream of metrics alone)
        if not found:
            raise ApiError(f"no run has the id or name {wanted[:100]!r} " + (f"at {self.url}" if self.url else f"under {self.root}"))
        if len(found) > 1:
            raise ApiError(f"run name {wanted!r} is ambiguous: runs {', '.join(r.id for r in found)} have it (give one's id)")
        return found[0]

    # -- reading

    def history(self, run_id: str, keys: list[str] | None = None, attempt: int | None = None, steps=None,
                source: str = "metrics"):
        """The run's points as one Arrow table (see `Run.history`)."""
        if self.url is None:
            table, _ = self._local(lambda h: h.history(self.root, run_id, keys, attempt=attempt, steps=steps, source=source))
            return table
        import pyarrow as pa

        from runledger.queries.history import from_jsonable

        lo, hi = _steps(steps)
        params = {"run": run_id, "source": source, "limit": str(PAGE_ROWS)}
        if keys is not None:
            params["keys"] = json.dumps(list(keys))
        for name, value in (("attempt", attempt), ("from", lo), ("to", hi)):
            if value is not None:
                params[name] = str(value)
        pages, cursor = [], None
        while True:
            page = self._get("/api/history", {**params, **({"cursor": cursor} if cursor else {})})
            pages.append(pa.Table.from_pydict({c: from_jsonable(page["columns"][c]) for c in page["column_order"]}))
            cursor = page.get("cursor")
            if not cursor:
                break
        pages = [p for p in pages if p.num_rows] or pages[:1]
        return pa.concat_tables(pages, promote_options="permissive") if len(pages) > 1 else pages[0]

    def _local(self, read):
        """`read(runledger.queries.history)` over the root, its refusals as ApiError."""
        import duckdb

        from runledger.ledger.storage.paths import NotALedger, SnapshotGone
        from runledger.queries import QueryTimeout
        from runledger.queries import history

        try:
            return read(history)
        except (ValueError, NotALedger, SnapshotGone, QueryTimeout) as err:
            raise ApiError(str(err).splitlines()[0] if str(err) else type(err).__name__) from None
        except duckdb.Error as err:
            raise ApiError(f"cannot read {self.root}: {str(err).splitlines()[0]}") from None

    def _get(self, path: str, params: dict) -> dict:
        """GET a dashboard's JSON, with the read token; a refusal as ApiError with the dashboard's reason."""
        headers = {"x-requested-with": "runledger.Api", "accept": "application/json"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(f"{self.url}{path}?{urllib.parse.urlencode(params)}", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            body = err.read().decode("utf-8", "replace")
            try:
                reason = json.loads(body).get("error") or body
            except (ValueError, AttributeError):
                reason = body
            hint = " (give the dashboard's read token: Api(url=..., token=...))" if err.code == 401 else ""
            raise ApiError(f"{self.url} refused: {err.code} {' '.join(str(reason).split())[:300]}{hint}") from None
        except (urllib.error.URLError, OSError) as err:
            raise ApiError(f"cannot reach {self.url}: {getattr(err, 'reason', err)}") from None
        except ValueError:
            raise ApiError(f"{self.url}{path} did not answer JSON (is it a runledger dashboard?)") from None


class Run:
    """One run as `Api.runs` read it: id, name, project, group, job_type, notes, tags, state, attempts,
    started_at, config (every config.update applied), summary (its last run_finished's)."""

    def __init__(self, api: Api, row: dict) -> None:
        self._api, self._row = api, row
        self.id = self.run_id = row["run_id"]
        self.name, self.project, self.group = row.get("name"), row.get("project"), row.get("group")
        self.job_type, self.notes, self.state = row.get("job_type"), row.get("notes"), row.get("state")
        self.tags, self.config, self.summary = list(row.get("tags") or []), dict(row.get("config") or {}), dict(row.get("summary") or {})
        self.attempts, self.started_at = row.get("attempts"), row.get("started_at")

    def __repr__(self) -> str:
        return f"<Run {self.id} ({self.name}) {self.state}>"

    @property
    def path(self) -> list[str]:
        return [self.project or "", self.id]

    def history(self, keys: list[str] | str | None = None, *, attempt: int | None = None, steps=None,
                source: str = "metrics", format: str = "arrow", samples: int | None = None, pandas: bool | None = None,
                **_: Any):
        """Every point of `keys` (None: every key the run logged): columns step, attempt, time, then one per key
        (a row per `runledger.log` call holding one of them; NaN and ±Infinity read back as logged). `attempt`:
        that attempt's points only (default each step from the latest attempt that logged it); `steps`: (first,
        last) inclusive or a range; `source="step"`: the typed step events of runledger's own trainer; `format`:
        arrow (a pyarrow Table), pandas or polars. W&B's `samples` is ignored (every point comes back)."""
        if pandas is not None:  # (W&B's run.history(pandas=True))
            format = "pandas" if pandas else format
        if format not in FORMATS:
            raise ApiError(f"format {str(format)[:40]!r} is not one of {', '.join(FORMATS)}")
        keys = [keys] if isinstance(keys, str) else keys
        table = self._api.history(self.id, keys, attempt, steps, source)
        if format == "pandas":
            return table.to_pandas()
        if format == "polars":
            import polars as pl

            return pl.from_arrow(table)
        return table

    def scan_history(self, keys: list[str] | None = None, **kw: Any):
        """W&B's scan_history: the same points, a dict per row."""
        yield from self.history(keys, **kw).to_pylist()

    @property
    def files(self) -> list[dict]:
        """The files the run recorded (`run.save`, `log_artifact`, `log_checkpoint`): path, sha256, bytes."""
        if self._api.url is not None:
            raise ApiError("run.files reads a root (Api(root=...)); a dashboard does not serve them yet")
        from runledger import queries

        cols, rows = self._api._local(lambda h: queries.query(
            self._api.root, f"select path, sha256, bytes, via, step from artifacts where run_id = {queries.sql_str(self.id)} "
                            "order by seq", max_rows=None, max_bytes=None))
        return [dict(zip(cols, r)) for r in rows]

    @property
    def histograms(self):
        raise ApiError("histograms are not stored yet (the values issue): runledger.log keeps numbers only")

    @property
    def tables(self):
        raise ApiError("tables are not stored yet (the values issue): runledger.log keeps numbers only")


def _has_events(root: Path, run_id: str) -> bool:
    from runledger.ledger.contract.events import NAME_RE
    from runledger.ledger.storage.paths import event_files

    return bool(NAME_RE.fullmatch(run_id)) and bool(event_files(root, run_id=run_id))


def _steps(steps) -> tuple[int | None, int | None]:
    if steps is None:
        return None, None
    if isinstance(steps, range):
        return steps.start, steps.stop - 1
    try:
        lo, hi = steps
    except (TypeError, ValueError):
        raise ApiError("steps is (first, last) or a range") from None
    return lo, hi
