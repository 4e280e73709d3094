"""Credentials kept out of log lines: `redact(text)` writes the password of every URL as ***, and
`RedactCredentials` does it to every log record that passes a handler it is added to.

A URL such as `nats://ledger:s3cret@127.0.0.1:4222` (a credentials file's content, see
ledger/bus/natsserver.py) becomes `nats://ledger:***@127.0.0.1:4222`; a URL with a token and no user
(`nats://t0ken@host`) becomes `nats://***@host`.
"""

from __future__ import annotations

import logging
import re

# scheme://userinfo@ : the userinfo holds no "/", "@" or white space (RFC 3986 section 3.2.1)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/@\s]+)@")


def _hide(match: re.Match) -> str:
    user, colon, _ = match["userinfo"].partition(":")
    return f"{match['scheme']}{user + ':***' if colon else '***'}@"


def redact(text: str) -> str:
    """`text` with the password (or token) of every URL in it replaced by ***."""
    return _USERINFO.sub(_hide, text) if "@" in text else text


class RedactCredentials(logging.Filter):
    """A handler filter: the record's message, arguments and traceback with their URLs redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: the handler reports it as it would have
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def install() -> None:
    """Add RedactCredentials to every handler of the root logger (call after logging is configured)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactCredentials) for f in handler.filters):
            handler.addFilter(RedactCredentials())
