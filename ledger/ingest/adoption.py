"""A new stream adopted in place of the one a root's tables were fed by: `runledger ledger adopt-stream`
(a person, once the root's spools are replayed into the new stream), and the embedded default's
supervisor whose own server folder was lost (runledger.ledger.local), which says so in one line.

The tables' commits name the stream they were fed by (runledger.ledger.storage.streampos); a ledger
refuses any other (StreamLost, recorded in HALTED). Adopting records the new stream's identity in the
root, clears a HALTED that refusal wrote, and sets the root's position back to 0: the ledger takes the
new stream from its first message, and what it stored already comes as a duplicate (same event_id,
same hash), stored once.
"""

from __future__ import annotations

import logging
from pathlib import Path

from runledger.ledger.contract.events import STREAM
from runledger.ledger.storage import locks, store, streampos
from runledger.ledger.storage.paths import HALTED_FILE

log = logging.getLogger(__name__)


def tables_stream(root: Path) -> str | None:
    """The stream the root's ledger takes messages from now (its tables', or one adopted since)."""
    return streampos.expected(root, streampos.read(store.tables_of(root)))[0]


async def adopt_stream(root: Path, js, reason: str) -> str | None:
    """Adopt the stream the server now holds for `root` if it is not the tables'; returns the line
    saying what was done, or None if there was nothing to adopt. Call holding the root's ledger lock."""
    root = Path(root)
    found = await streampos.stream_identity(js, STREAM)
    was = tables_stream(root)
    if was is None or was == found:
        return None
    streampos.adopt(root, found, was, reason)
    halted = root / HALTED_FILE
    if halted.exists() and f"stream {STREAM}" in halted.read_text():  # (a halt for the stream alone: it is adopted)
        halted.unlink()
    return (f"root {root}: adopted stream {found} in place of {was} ({reason}); the ledger takes it from its first "
            f"message, storing nothing twice")


async def adopt_command(root: Path, nats_url: str) -> str:
    """`runledger ledger adopt-stream`: adopt the server's stream for `root` (no ledger may serve it meanwhile)."""
    from runledger.ledger.bus import jetstream as bus

    lock = locks.hold(Path(root) / "ledger.lock", f"ledger root {root}")
    try:
        nc = await bus.connect(nats_url, name="adopt-stream")
        try:
            js = nc.jetstream()
            await bus.ensure_stream(js)
            said = await adopt_stream(Path(root), js, "adopted by `runledger ledger adopt-stream`")
        finally:
            await nc.close()
    finally:
        lock.release()
    return said or f"root {root} already takes stream {await _shown(nats_url)}: nothing to adopt"


async def _shown(nats_url: str) -> str:
    from runledger.ledger.bus import jetstream as bus

    nc = await bus.connect(nats_url, name="adopt-stream")
    try:
        return await streampos.stream_identity(nc.jetstream(), STREAM)
    finally:
        await nc.close()


async def adopt_if_lost(root: Path, nats_url: str) -> None:
    """The embedded default: the supervisor's own server lost its folder (a new stream): adopted, said in one line."""
    from runledger.ledger.bus import jetstream as bus

    try:
        lock = locks.hold(Path(root) / "ledger.lock", f"ledger root {root}")
    except locks.Busy:  # another ledger serves the root: its own refusal says what to do
        return
    try:
        nc = await bus.connect(nats_url, name="adopt-stream")
        try:
            js = nc.jetstream()
            await bus.ensure_stream(js)
            said = await adopt_stream(Path(root), js, "the local server's folder was lost")
        finally:
            await nc.close()
        if said:
            log.warning("%s", said)
    finally:
        lock.release()
