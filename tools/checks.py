"""The CLI's argument checks: argparse `type=` functions that refuse bad input up front, before a
command opens a file, a server or a ledger (argparse then prints the usage and one reason, exit 2).

Each returns the value converted (an int, a float, a str path) or raises ArgumentTypeError with a
reason. Every subcommand uses them for its numbers, names, files, folders and server URLs; a
subcommand's own rules (one option with another) stay in the command.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from runledger.ledger import redact, settings

INT64_MAX = 2**63 - 1  # a stored int (a seq, a step, a snapshot) is an int64
NATS_SCHEMES = ("nats", "tls", "ws", "wss")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class Bad(argparse.ArgumentTypeError):
    """An argument's value refused, with the reason argparse prints."""


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise Bad(f"{shown(text)} is not a whole number") from None


def int_in(low: int, high: int = INT64_MAX, what: str = "") -> callable:
    """A whole number in [low, high]."""
    def check(text: str) -> int:
        n = _int(text)
        if not low <= n <= high:
            raise Bad(f"{n} is out of range: {what or 'a number'} from {low} to {high}")
        return n
    check.__name__ = "int"  # (argparse names the type in its message)
    check.int_like = True
    return check


positive = int_in(1)
count = int_in(0)


def float_in(low: float, high: float = math.inf, low_open: bool = False) -> callable:
    """A finite number in [low, high] (or (low, high] when `low_open`)."""
    def check(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise Bad(f"{shown(text)} is not a number") from None
        if not math.isfinite(x) or x < low or x > high or (low_open and x == low):
            raise Bad(f"{shown(text)} is out of range: a finite number {'above' if low_open else 'from'} {low:g}"
                      + ("" if high == math.inf else f" up to {high:g}"))
        return x
    check.__name__ = "float"
    check.float_like = True
    return check


positive_float = float_in(0.0, low_open=True)


def line(text: str) -> str:
    """Any text on one line: no newline or other control character."""
    if _CONTROL.search(text):
        raise Bad(f"{shown(text)} holds a control character (a newline, say)")
    return text


def name_of(what: str) -> callable:
    """A check of a run id, producer, ladder or consumer name (`what`, in the reason):
    runledger.ledger.contract.validation.check_name's rule (a subject token and a folder name: no dots, slashes or spaces)."""
    def check(text: str) -> str:
        from runledger.ledger.contract.validation import check_name  # (here: the contract loads pydantic, which most commands never need)

        try:
            return check_name(text, what)
        except ValueError as err:
            raise Bad(str(err)) from None
    check.__name__ = what
    return check


run_id = name_of("run_id")


def run(text: str) -> str:
    """A run as a person names it: its id, or its display name where one run has it (any text on one
    line; the command looks it up: `runledger.tools.cli.resolve_run_arg`)."""
    if not text.strip():
        raise Bad("an empty run id or name")
    return line(text)


def file_in(text: str) -> str:
    """A file this user can read."""
    path = Path(line(text))
    if not path.exists():
        raise Bad(f"{text}: no such file")
    if path.is_dir():
        raise Bad(f"{text} is a folder, not a file")
    if not os.access(path, os.R_OK):
        raise Bad(f"{text} is not readable by this user")
    return text


def file_out(text: str) -> str:
    """A file to write: its folder exists and this user can write there; it is not a folder."""
    path = Path(line(text))
    if path.is_dir():
        raise Bad(f"{text} is a folder, not a file")
    folder = path.parent
    if not folder.is_dir():
        raise Bad(f"{text}: no folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise Bad(f"{text} is not writable by this user")
    return text


def folder(text: str) -> str:
    """A folder that exists, or one whose parent exists (it is then made): a ledger root, say; the
    user's default root is made with its parents."""
    path = Path(line(text))
    if path.exists():
        if not path.is_dir():
            raise Bad(f"{text} is not a folder")
    elif not path.parent.is_dir() and text != settings.user_root():
        raise Bad(f"{text}: no folder {path.parent} to make it in")
    return text


def nats_url(text: str) -> str:
    """One or more NATS server URLs, comma-separated: nats://, tls://, ws:// or wss://, with a host
    and, if given, a port from 1 to 65535."""
    line(text)
    for url in text.split(","):
        url = url.strip()
        parts = urlsplit(url)
        if parts.scheme not in NATS_SCHEMES or not parts.hostname or " " in url:
            raise Bad(f"{shown(redact.redact(url))} is not a NATS URL ({', '.join(s + '://HOST:PORT' for s in NATS_SCHEMES)})")
        try:
            port = parts.port
        except ValueError:
            port = -1
        if port is not None and not 1 <= port <= 65535:
            raise Bad(f"{shown(redact.redact(url))}: the port is not a TCP port (1-65535)")
    return text


def shown(text: str) -> str:
    """`text` quoted for an error message, control characters escaped and cut short."""
    return repr(text if len(text) <= 120 else text[:120] + "…")


def health_profile(text: str) -> str:
    """A health profile of the rule book (`runledger.queries.thresholds.PROFILES`)."""
    from runledger.queries.thresholds import PROFILES

    if text not in PROFILES:
        raise Bad(f"{shown(text)} is not a health profile: one of {', '.join(PROFILES)}")
    return text


def preset(text: str) -> str:
    """A preset of `runledger.training.config.PRESETS` (read when a command is given one: the others never
    load the training config, nor the contract it hashes with)."""
    from runledger.training.config import PRESETS

    if text not in PRESETS:
        raise Bad(f"{shown(text)} is not a preset: one of {', '.join(sorted(PRESETS))}")
    return text
