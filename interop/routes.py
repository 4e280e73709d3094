"""Where `runledger notify` sends what: routes read from a small TOML (or JSON) file, and the events each takes.

    [[route]]
    name = "oncall"                       # 1-64 of a-z 0-9 _ -, unique
    url = "https://hooks.slack.com/services/T000/B000/XXXX"
    format = "slack"                      # slack | json (default json)
    kinds = ["alert"]                     # alert, decision (default both)
    severity = ["warn", "fail"]           # alerts of these severities (default any); decisions have none
    agents = ["agent-*", "person:*"]      # globs on the payload's agent (default any)
    producers = ["agent-*"]               # globs on the envelope's producer (default any)
    runs = ["prod-*"]                     # globs on run_id (default any)
    timeout_s = 10                        # one request's limit in all, connect to last byte (default 10)
    headers = { Authorization = "env:ONCALL_TOKEN" }   # "env:NAME": the value of $NAME, read at start
    cooldown_s = 600                      # an alert_id not sent again within this unless its severity rises (0: off)
    digest_every_s = 900                  # alerts of digest_severity sent as one digest this often (0: off)
    digest_severity = ["info"]            # which severities wait for the digest (default info)
    repeat_every_s = 300                  # a `fail` alert pages again this often until acknowledged or resolved (0: off)
    params = { token = "env:PUSHOVER_TOKEN", user = "env:PUSHOVER_USER" }  # fields added to a pushover body

The paging rules (cooldown, digest, repeat until acknowledged) are runledger.interop.paging's; format
`ntfy` posts to an ntfy topic URL (the text, with Title, Priority and Tags headers), `pushover` to
Pushover's messages API (`params` holds its token and user key).

An event goes to every route it matches (all of a route's conditions hold). Unknown keys are an error,
so a misspelt condition cannot silently widen a route.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from runledger.interop.webhook import header_problem, url_problem
from runledger.interop.webhook import where as webhook_where
from runledger.ledger.contract.events import NAME_RE, AlertRaised

KINDS = ("alert", "decision")
FORMATS = ("slack", "json", "ntfy", "pushover")
SEVERITIES = tuple(AlertRaised.model_fields["severity"].annotation.__args__)  # info, warn, fail (the contract's)
DEFAULT_TIMEOUT_S = 10.0  # a receiver that has not answered in this time has failed this try
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class RoutesError(ValueError):
    """A routes file that cannot be used; the message is the one-line reason."""


@dataclass(frozen=True)
class Route:
    name: str
    url: str
    format: str = "json"
    kinds: tuple[str, ...] = KINDS
    severity: tuple[str, ...] = ()
    agents: tuple[str, ...] = ()
    producers: tuple[str, ...] = ()
    runs: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    headers: dict[str, str] = field(default_factory=dict)
    cooldown_s: float = 0.0
    digest_every_s: float = 0.0
    digest_severity: tuple[str, ...] = ("info",)
    repeat_every_s: float = 0.0
    params: dict[str, str] = field(default_factory=dict)

    @property
    def pages(self) -> bool:
        """Whether any paging rule is on (runledger.interop.paging)."""
        return bool(self.cooldown_s or self.digest_every_s or self.repeat_every_s)

    def matches(self, env: dict) -> bool:
        """Whether the route takes this (valid) envelope."""
        p = env["payload"]
        return (env["kind"] in self.kinds
                and (not self.severity or env["kind"] != "alert" or p.get("severity", "warn") in self.severity)
                and _any_glob(self.agents, p.get("agent", ""))
                and _any_glob(self.producers, env["producer"])
                and _any_glob(self.runs, env["run_id"]))


def _any_glob(globs: tuple[str, ...], value: str) -> bool:
    return not globs or any(fnmatch.fnmatchcase(value, g) for g in globs)


_KEYS = set(Route.__dataclass_fields__)


def _strings(name: str, where: str, value, allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise RoutesError(f"{where}: {name} is a list of strings")
    bad = [v for v in value if allowed is not None and v not in allowed]
    if bad:
        raise RoutesError(f"{where}: {name} {bad[0]!r} is not one of {', '.join(allowed)}")
    return tuple(value)


def route_from(obj: dict, i: int, env: dict[str, str] | None = None) -> Route:
    """One route from its table in the file (`env`: where "env:NAME" header values come from)."""
    env = os.environ if env is None else env
    named = isinstance(obj, dict) and isinstance(obj.get("name"), str) and NAME_RE.fullmatch(obj["name"])
    where = f"route {i}" + (f" ({obj['name']!r})" if named else "")
    if not isinstance(obj, dict):
        raise RoutesError(f"{where}: a route is a table of keys")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise RoutesError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(_KEYS))})")
    for key in ("name", "url"):
        if not isinstance(obj.get(key), str):
            raise RoutesError(f"{where}: {key} is required (a string)")
    if not NAME_RE.fullmatch(obj["name"]):
        raise RoutesError(f"{where}: name {obj['name']!r}: use 1-64 of a-z 0-9 _ - starting with a letter or digit")
    problem = url_problem(obj["url"])
    if problem:  # (the message shows no more of a URL than scheme://host:port: its path may be its secret)
        shown = webhook_where(obj["url"])
        raise RoutesError(f"{where}: url {shown + ' ' if shown else ''}{problem}")
    fmt = obj.get("format", "json")
    if fmt not in FORMATS:
        raise RoutesError(f"{where}: format {fmt!r} is not one of {', '.join(FORMATS)}")
    timeout = obj.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 300:
        raise RoutesError(f"{where}: timeout_s {timeout!r} is not a number of seconds in (0, 300]")
    headers = obj.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items()):
        raise RoutesError(f"{where}: headers is a table of strings")
    resolved = {}
    for k, v in headers.items():
        problem = header_problem(k, "") or (k.lower() == "idempotency-key" and f"header {k} is notify's own")
        if problem:
            raise RoutesError(f"{where}: {problem}")
        v = _from_env(v, f"header {k}", where, env)
        problem = header_problem(k, v)
        if problem:  # (never the value: it is a secret)
            raise RoutesError(f"{where}: {problem}")
        resolved[k] = v
    params = obj.get("params", {})
    if not isinstance(params, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()):
        raise RoutesError(f"{where}: params is a table of strings")
    params = {k: _from_env(v, f"params.{k}", where, env) for k, v in params.items()}
    if fmt == "pushover" and not {"token", "user"} <= set(params):
        raise RoutesError(f"{where}: a pushover route needs params.token and params.user (e.g. \"env:PUSHOVER_TOKEN\")")
    seconds = {}
    for key in ("cooldown_s", "digest_every_s", "repeat_every_s"):
        value = obj.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 7 * 86400:
            raise RoutesError(f"{where}: {key} {value!r} is not a number of seconds in [0, 604800] (0: off)")
        seconds[key] = float(value)
    for key in ("agents", "producers", "runs"):
        if any(_CONTROL.search(g) for g in obj.get(key, []) if isinstance(g, str)):
            raise RoutesError(f"{where}: {key}: a glob holds a control character")
    return Route(
        name=obj["name"], url=obj["url"], format=fmt,
        kinds=_strings("kinds", where, obj.get("kinds", list(KINDS)), KINDS),
        severity=_strings("severity", where, obj.get("severity", []), SEVERITIES),
        agents=_strings("agents", where, obj.get("agents", [])),
        producers=_strings("producers", where, obj.get("producers", [])),
        runs=_strings("runs", where, obj.get("runs", [])),
        timeout_s=float(timeout), headers=resolved, params=params,
        digest_severity=_strings("digest_severity", where, obj.get("digest_severity", ["info"]), SEVERITIES),
        **seconds,
    )


def _from_env(value: str, what: str, where: str, env: dict[str, str]) -> str:
    """A value as given, or, written "env:NAME", the value of $NAME (read at start: a secret stays out of the file)."""
    if not value.startswith("env:"):
        return value
    if not value[4:]:
        raise RoutesError(f"{where}: {what}: \"env:\" needs the name of a variable")
    if value[4:] not in env:
        raise RoutesError(f"{where}: {what} names ${value[4:]}, which is not set")
    return env[value[4:]]


def parse_routes(text: str, suffix: str = ".toml", env: dict[str, str] | None = None) -> list[Route]:
    """Routes from a file's text: TOML (`[[route]]` tables), or JSON (`{"route": [...]}`) for a .json file."""
    try:
        doc = json.loads(text) if suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        raise RoutesError(f"not {'JSON' if suffix == '.json' else 'TOML'}: {err}") from None
    if not isinstance(doc, dict) or set(doc) - {"route"}:
        raise RoutesError("a routes file holds only `route` tables ([[route]])")
    tables = doc.get("route", [])
    if not isinstance(tables, list) or not tables:
        raise RoutesError("no routes: add at least one [[route]] with a name and a url")
    routes = [route_from(t, i, env) for i, t in enumerate(tables)]
    names = [r.name for r in routes]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise RoutesError(f"route name {dup!r} is used twice")
    return routes


def load_routes(path: str | Path) -> list[Route]:
    path = Path(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise RoutesError(f"cannot read {path}: {err}") from None
    return parse_routes(text, path.suffix.lower())
