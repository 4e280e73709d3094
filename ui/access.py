"""Who may use the dashboard: loopback only unless a token is set, every request carrying the token
when one is, read-only and read-write tokens, and CSRF protection on every POST.

- Bound to loopback without tokens: reads need none (only this machine reaches it); the Host header
  must name the loopback (a DNS-rebinding page cannot read it). A read-write token is made at start
  and printed in the URL (as Jupyter does), because approve and reject always need one.
- Given tokens (required to bind any other address): every request must carry one, as
  `Authorization: Bearer T`, an `X-Runledger-Token` header, or the cookie a first `?token=T` visit sets.
- POST (approve, reject) needs the read-write token and the CSRF token: the `rl_csrf` cookie's value
  repeated in an `X-CSRF-Token` header (a page of another origin can neither read the cookie nor set
  the header), and an Origin, when sent, that is this server's.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import secrets
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import parse_qsl, urlencode

READ, WRITE = "read", "write"
TOKEN_COOKIE, CSRF_COOKIE = "rl_token", "rl_csrf"
TOKEN_HEADER, CSRF_HEADER = "x-runledger-token", "x-csrf-token"
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


def _cookies(headers: dict[str, str]) -> dict[str, str]:
    jar = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed cookie header carries no token
        return {}
    return {k: m.value for k, m in jar.items()}


class AccessMiddleware:
    """ASGI middleware applying `Access` to every HTTP request (see the module docstring)."""

    def __init__(self, app, access: Access):
        self.app, self.access = app, access

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = _headers(scope)
        cookies = _cookies(headers)
        if self.access.loopback and not is_loopback(headers.get("host", "").rsplit(":", 1)[0]):
            return await _refuse(send, 403, "this dashboard answers only to a loopback Host")
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        given = query.get("token")
        if given is not None and scope["method"] == "GET":
            if self.access.role(given) is None:
                return await _refuse(send, 401, "that token is not valid")
            # a first visit with ?token=: keep it in a cookie and drop it from the address bar
            rest = urlencode({k: v for k, v in query.items() if k != "token"})
            return await _redirect(send, scope["path"] + (f"?{rest}" if rest else ""), given)
        auth = headers.get("authorization", "")
        token = (auth[7:] if auth.lower().startswith("bearer ") else None) or headers.get(TOKEN_HEADER) \
            or cookies.get(TOKEN_COOKIE)
        role = self.access.role(token)
        if role is None and (token or not self.access.open_reads):
            return await _refuse(send, 401, "a token is required: open the address printed by `runledger ui` "
                                            "(…/?token=…) or send Authorization: Bearer TOKEN")
        if scope["method"] not in ("GET", "HEAD"):
            if role != WRITE:
                return await _refuse(send, 403, "this needs the read-write token" if role is None
                                     else "a read-only token cannot approve or reject")
            csrf = cookies.get(CSRF_COOKIE)
            if not csrf or not hmac.compare_digest(csrf.encode(), headers.get(CSRF_HEADER, "").encode()):
                return await _refuse(send, 403, "missing or wrong CSRF token (X-CSRF-Token must repeat the rl_csrf cookie)")
            origin = headers.get("origin")
            if origin and origin.split("://", 1)[-1] != headers.get("host"):
                return await _refuse(send, 403, f"cross-origin request from {origin} refused")
        scope.setdefault("state", {})["role"] = role or READ
        if CSRF_COOKIE in cookies:
            return await self.app(scope, receive, send)

        async def send_with_csrf(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"set-cookie", _cookie(CSRF_COOKIE, secrets.token_urlsafe(24), http_only=False))]
            await send(message)

        return await self.app(scope, receive, send_with_csrf)


def _cookie(name: str, value: str, http_only: bool = True) -> bytes:
    return f"{name}={value}; Path=/; SameSite=Strict{'; HttpOnly' if http_only else ''}".encode()


async def _refuse(send, status: int, reason: str) -> None:
    body = reason.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _redirect(send, location: str, token: str) -> None:
    await send({"type": "http.response.start", "status": 303,
                "headers": [(b"location", location.encode()), (b"set-cookie", _cookie(TOKEN_COOKIE, token)),
                            (b"set-cookie", _cookie(CSRF_COOKIE, secrets.token_urlsafe(24), http_only=False)),
                            (b"content-length", b"0")]})
    await send({"type": "http.response.body", "body": b""})
