"""A person taking a page: the `alert_ack` event (who, how, the envelope's time when) that stops notify repeating it.

`acknowledgement(alert_id, by, via)` makes the typed `AlertAcknowledged`; `record(root, nats_url, run_id, ack,
producer)` emits it through the NATS `Emitter` (spool first: an acknowledgement accepted is never lost) on
the chain of `producer`: `cli`, the dashboard's `ui`, or `notify` (its ack listener, runledger.interop.ackhook).
The ledger quarantines one from any other producer (runledger.ledger.contract.roles.may_acknowledge).
"""

from __future__ import annotations

import re
import threading

from runledger.ledger import settings

PERSON = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._@+-]{0,63}$")  # a name shown in the audit, never markup
_ONE_AT_A_TIME = threading.Lock()  # one Emitter per chain at a time (its spool's lock)


class AckRefused(ValueError):
    """The acknowledgement cannot be made: a bad name or alert id; the message is the one-line reason."""


def acknowledgement(alert_id: str, by: str, via: str, note: str | None = None):
    """The typed `AlertAcknowledged` of alert `alert_id` by person `by` (a plain name), given `via`."""
    from runledger.ledger.contract.events import AlertAcknowledged

    if not isinstance(by, str) or not PERSON.match(by):
        raise AckRefused(f"{by!r} is not a name: letters, digits, space and ._@+- (at most 64)")
    if not isinstance(alert_id, str) or not 0 < len(alert_id) <= 256 or re.search(r"[\x00-\x1f\x7f]", alert_id):
        raise AckRefused("alert_id is 1-256 characters, none a control character")
    if note is not None and (not isinstance(note, str) or len(note) > 1024):
        raise AckRefused("note is a string of at most 1024 characters")
    return AlertAcknowledged(alert_id=alert_id, by=by, via=via, note=note or None)


def record(root, nats_url: str | None, run_id: str, ack, producer: str, timeout: float = 30.0) -> bool:
    """Emit `ack` for `run_id` on `producer`'s chain; True once NATS acknowledged it, False if it is
    spooled and will be sent next time."""
    from runledger.ledger.contract.validation import check_name
    from runledger.ledger.emit.chains import next_attempt
    from runledger.ledger.emit.emitter import Emitter

    check_name(run_id, "run_id")
    spool = settings.spool_dir(root)
    with _ONE_AT_A_TIME:
        attempt = next_attempt(run_id, producer, spool, root=root, continue_spooled=True)
        em = Emitter(run_id, producer, attempt, nats_url, spool)
        em.emit(ack, step=None)
        return em.close(timeout=timeout)
