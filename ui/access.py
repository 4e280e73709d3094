"""Who may use the dashboard: loopback only unless a token is set, the token in a header of every API
request (never in a cookie), read-only and read-write tokens.

- The page and its static files hold no data: they are served to whoever reaches the server. The page
  takes `?token=T` once from its address, keeps it in sessionStorage (this origin's, this tab's) and
  takes it out of the address, then sends it on every request as `X-Runledger-Token` (or a script
  sends `Authorization: Bearer T`). No token goes into a cookie: a cookie is scoped by host, not port,
  so every other server on 127.0.0.1 the browser visits would receive it.
- Every `/api/` request needs a header a page of another origin cannot send without a CORS preflight
  (which this server never answers): the token, or, on a loopback dashboard started without tokens
  (reads open to this machine), `X-Requested-With` for a read. So an `<img>` or a form on another
  local origin reads and decides nothing. The Host header must name the loopback when bound to it
  (a DNS-rebinding page cannot read it).
- A POST (approve, reject) needs the read-write token, an Origin, when sent, that is this server's,
  and a body of at most MAX_BODY bytes. A read-write token is made at start and printed in the URL
  (as Jupyter does), because approve and reject always need one.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

READ, WRITE = "read", "write"
TOKEN_HEADER, SCRIPT_HEADER = "x-runledger-token", "x-requested-with"
MAX_BODY = 64 * 1024  # bytes of a POST's body (a review is a few hundred)
_LOOPBACK_NAMES = {"localhost"}


def is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class Access:
    """The tokens in force: token -> READ or WRITE; `open_reads`: reads need no token (loopback, none given)."""

    tokens: dict[str, str] = field(default_factory=dict)
    open_reads: bool = True
    loopback: bool = True

    def role(self, token: str | None) -> str | None:
        if not token:
            return None
        for known, role in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return role
        return None

    @property
    def write_token(self) -> str | None:
        return next((t for t, r in self.tokens.items() if r == WRITE), None)


def read_token_file(path: str | Path) -> dict[str, str]:
    """A creds file: JSON {"token": read-write, "read_token": read-only} (either may be absent)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict) or not ({"token", "read_token"} & set(data)):
        raise ValueError(f"{path}: expected JSON with \"token\" and/or \"read_token\"")
    return {k: str(v) for k, v in data.items() if k in ("token", "read_token") and v}


def configure(host: str, token: str | None = None, read_token: str | None = None,
              token_file: str | Path | None = None) -> Access:
    """The access rules for a server bound to `host`; ValueError when a non-loopback host has no token."""
    if token_file:
        given = read_token_file(token_file)
        token, read_token = token or given.get("token"), read_token or given.get("read_token")
    for t in (token, read_token):
        if t is not None and len(t) < 16:
            raise ValueError("a token must be at least 16 characters (e.g. `python -c 'import secrets; print(secrets.token_urlsafe())'`)")
    loopback = is_loopback(host)
    if not loopback and not (token or read_token):
        raise ValueError(f"--host {host} is not loopback: give --token (and/or --read-token, or --token-file), "
                         "which every request must then carry")
    tokens = {}
    if read_token:
        tokens[read_token] = READ
    open_reads = loopback and not (token or read_token)
    tokens[token or secrets.token_urlsafe(24)] = WRITE  # approve and reject always need a token
    return Access(tokens, open_reads, loopback)


def _headers(scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _given_token(headers: dict[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    return (auth[7:].strip() if auth.lower().startswith("bearer ") else None) or headers.get(TOKEN_HEADER) or None


class AccessMiddleware:
    """ASGI middleware applying `Access` to every HTTP request (see the module docstring)."""

    def __init__(self, app, access: Access):
        self.app, self.access = app, access

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        send = _hardened(send)
        if self.access.loopback and not is_loopback(headers.get("host", "").rsplit(":", 1)[0]):
            return await _refuse(send, 403, "this dashboard answers only to a loopback Host")
        if not scope["path"].startswith("/api/"):  # the page and its code: no data, no action
            if scope["method"] not in ("GET", "HEAD"):
                return await _refuse(send, 405, "only GET here")
            scope.setdefault("state", {})["role"] = None
            return await self.app(scope, receive, send)
        token = _given_token(headers)
        role = self.access.role(token)
        if role is None and token:
            return await _refuse(send, 401, "that token is not valid")
        read = scope["method"] in ("GET", "HEAD")
        if role is None and not (read and self.access.open_reads and SCRIPT_HEADER in headers):
            return await _refuse(send, 401, "a token is required: open the address printed by `runledger ui` "
                                            "(…/?token=…), or send X-Runledger-Token: TOKEN")
        if not read:
            if role != WRITE:
                return await _refuse(send, 403, "this needs the read-write token" if role is None
                                     else "a read-only token cannot approve or reject")
            origin = headers.get("origin")
            if origin and origin.split("://", 1)[-1] != headers.get("host"):
                return await _refuse(send, 403, f"cross-origin request from {origin[:100]} refused")
            length = headers.get("content-length", "0")
            if not length.isdigit() or int(length) > MAX_BODY:
                return await _refuse(send, 413, f"a body of at most {MAX_BODY} bytes, with its Content-Length")
        scope.setdefault("state", {})["role"] = role or READ
        return await self.app(scope, receive, send)


def _hardened(send):
    """`send` with headers that keep a response to this origin: no Referer carries the page's address
    (with a ?token= before the page takes it out), no type sniffing."""
    async def hardened(message):
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), (b"referrer-policy", b"no-referrer"),
                                  (b"x-content-type-options", b"nosniff")]
        await send(message)

    return hardened


async def _refuse(send, status: int, reason: str) -> None:
    body = reason.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
