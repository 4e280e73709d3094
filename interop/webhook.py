"""One POST to a webhook's own URL, over by a deadline: no redirect followed, no proxy, nothing sent to another host.

`post(url, body, headers, timeout_s)` sends to the URL's host and port only and returns the 2xx status;
anything else raises `NotDelivered` with a reason safe to log (`HTTP 302 (a redirect: not followed)`,
`timed out after 5s`, the socket's error), which never holds the URL's userinfo, path or query nor a
header's value: `where(url)` (scheme://host:port) is all of a URL a message may show.

The deadline is total, not per read: connecting, sending, the status line and headers, and up to
BODY_CAP bytes of the answer all end by `timeout_s`, because a timer shuts the socket down at the
deadline (a receiver that trickles a byte at a time cannot stretch it). `post_async` runs it on a
daemon thread and gives up on it ABANDON_GRACE_S after the deadline (a name lookup that never
returns), so neither a stalled receiver nor a stop (SIGTERM) ever waits on a request.

`url_problem` and `header_problem` say what makes a URL or a header unsendable (routes are checked
with them up front), in messages that hold no secret either.
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import re
import socket
import ssl
import threading
import time
from urllib.parse import urlsplit

BODY_CAP = 64 * 1024  # bytes of an answer read (and dropped): only its status counts
ABANDON_GRACE_S = 5.0  # past its deadline, a request still running (stuck resolving a name) is left behind
RESERVED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})  # the client's own
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP header name (RFC 9110 section 5.6.2)
_HOST = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")  # (no control character nor space anywhere in a URL)


class NotDelivered(Exception):
    """A POST the receiver did not take; the message is the reason, safe to log."""


def where(url: str) -> str:
    """scheme://host:port of a URL, the only part of it that a message shows ("" for a URL without them)."""
    try:
        parts = urlsplit(url)
        if parts.scheme in ("http", "https") and parts.hostname and _CONTROL.search(url) is None:
            port = parts.port if parts.port is not None else (443 if parts.scheme == "https" else 80)
            host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
            return f"{parts.scheme}://{host}:{port}"
    except ValueError:
        pass
    return ""


def url_problem(url: str) -> str | None:
    """Why `url` cannot be posted to (None: it can), without quoting more of it than `where(url)`."""
    if _CONTROL.search(url):
        return "holds a space or a control character"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "has a port that is not a number in 1-65535"
    if parts.scheme not in ("http", "https"):
        return "is not an http(s) URL (http:// or https://)"
    if not parts.hostname:
        return "has no host"
    if "@" in parts.netloc:
        return "holds credentials (user:password@): put them in a header, e.g. Authorization = \"env:NAME\""
    if port is not None and not 1 <= port <= 65535:
        return "has a port that is not a number in 1-65535"
    if not _HOST.fullmatch(parts.hostname):
        try:
            ipaddress.ip_address(parts.hostname)
        except ValueError:
            return "has a host that is not a name or an IP address"
    return None


def header_problem(name: str, value: str) -> str | None:
    """Why a header cannot be sent (None: it can): a name that is not an HTTP token or is the client's
    own, a value with CR, LF, NUL or another control character (a second header smuggled in)."""
    if not _TOKEN.fullmatch(name):
        return "a header name is not an HTTP token (letters, digits and !#$%&'*+.^_`|~-)"
    if name.lower() in RESERVED_HEADERS:
        return f"header {name} is the HTTP client's own"
    if re.search(r"[\x00-\x08\x0a-\x1f\x7f]", value):
        return f"header {name}: its value holds CR, LF, NUL or another control character"
    return None


def _reason(err: BaseException) -> str:
    """A failed try's reason, from the error's kind and the socket's words (never its arguments)."""
    if isinstance(err, ssl.SSLError):
        return f"TLS: {err.reason or type(err).__name__}"
    if isinstance(err, OSError) and err.strerror:
        return f"{type(err).__name__}: {err.strerror}"
    return type(err).__name__


def post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
    """POST `body` to `url` itself within `timeout_s` in all (blocking); the 2xx status, else NotDelivered."""
    problem = url_problem(url)
    if problem:
        raise NotDelivered(f"the URL {problem}")
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname, parts.port, timeout=timeout_s,
                                           context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout_s)
    expired = threading.Event()

    def cut() -> None:  # at the deadline: whatever read or write is under way ends now
        expired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    deadline = time.monotonic() + timeout_s
    timer = threading.Timer(timeout_s, cut)
    timer.daemon = True
    timer.start()
    try:
        conn.connect()
        if expired.is_set() or time.monotonic() >= deadline:
            raise TimeoutError
        conn.request("POST", target, body=body, headers=headers)
        resp = conn.getresponse()
        status = resp.status
        resp.read(BODY_CAP)
        if expired.is_set():  # (an answer cut short at the deadline can look whole: it is not)
            raise TimeoutError
    except Exception as err:
        if expired.is_set() or isinstance(err, TimeoutError):
            raise NotDelivered(f"timed out after {timeout_s:g}s") from None
        raise NotDelivered(_reason(err)) from None
    finally:
        timer.cancel()
        conn.close()
    if 300 <= status < 400:
        raise NotDelivered(f"HTTP {status} (a redirect: not followed)")
    if not 200 <= status < 300:
        raise NotDelivered(f"HTTP {status}")
    return status


async def post_async(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
    """`post` on a daemon thread of its own, awaited at most timeout_s + ABANDON_GRACE_S; cancelling the
    awaiting task (a stop) leaves the thread to end by its own deadline, waited on by no one."""
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[int] = loop.create_future()

    def settle(status: int | None, err: BaseException | None) -> None:
        if not outcome.done():
            if err is None:
                outcome.set_result(status)
            else:
                outcome.set_exception(err)

    def work() -> None:
        try:
            status, err = post(url, body, headers, timeout_s), None
        except BaseException as e:  # (NotDelivered, or a bug: the awaiting task raises it)
            status, err = None, e
        try:
            loop.call_soon_threadsafe(settle, status, err)
        except RuntimeError:  # the loop is gone: no one waits any more
            pass

    threading.Thread(target=work, name="webhook-post", daemon=True).start()
    try:
        return await asyncio.wait_for(outcome, timeout_s + ABANDON_GRACE_S)
    except asyncio.TimeoutError:
        raise NotDelivered(f"timed out after {timeout_s:g}s") from None
