"""The dashboard's live feed without a server to follow (ui/live.py, issue 37 item 6): it is live by polling
the ledger's stored position, a page is woken once per store, and it says one state at a time: the same
state looked at again changes nothing (no flicker), a new one is said once. (A server that comes and moves:
tests/e2e/test_ui_live.py.)"""

from __future__ import annotations

import asyncio
import os

import pytest

from runledger.ledger import settings
from runledger.ledger.storage import positions
from runledger.ui import live
from runledger.ui.data import Reader

pytestmark = pytest.mark.slow  # (among the slowest unit files: `make test` runs it, `make test-fast` leaves it out)

FAST_S = 0.02  # the feed's polls and looks, made fast (this many seconds)
WATCHDOG_S = 10.0


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(live, "POLL_S", FAST_S)
    monkeypatch.setattr(live, "LOOK_S", FAST_S)


def feed_over(root, server, body) -> None:
    """Run `body(feed, reader)` (a coroutine function) over a started feed of `root` following `server`."""
    async def main() -> None:
        reader = Reader(root, threads=1)
        feed = live.Feed(reader, server)
        await feed.start()
        try:
            await asyncio.wait_for(body(feed, reader), WATCHDOG_S)
        finally:
            await feed.stop()
            reader.close()

    asyncio.run(main())


def test_with_no_server_for_its_root_the_feed_is_live_by_polling_and_wakes_the_pages_once_per_store(fast, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    positions.write_position(root, 5)

    async def body(feed, reader) -> None:
        st = feed.status()
        assert (st["live"], st["via"], st["reason"], st["position"]) == (True, "tables", live.NO_SERVER, 5)
        version = feed.version
        await asyncio.sleep(20 * FAST_S)  # looks and polls with nothing new: nothing said again
        assert feed.version == version
        positions.write_position(root, 6)  # the ledger stored a commit (a run's ledger that NATS does not reach us from)
        assert await feed.wait_change(version, WATCHDOG_S)
        assert reader.position == feed.status()["position"] == 6
        version = feed.version
        await asyncio.sleep(20 * FAST_S)
        assert feed.version == version  # once per store

    feed_over(root, lambda: None, body)


def test_a_server_named_and_then_gone_is_said_once_each_while_the_tables_keep_the_page_live(fast, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    named = {"url": None}  # what the root's server record says, as the test changes it

    async def said(feed, version: int) -> tuple[int, dict]:
        assert await feed.wait_change(version, WATCHDOG_S)
        return feed.version, feed.status()

    async def body(feed, reader) -> None:
        version = feed.version
        named["url"] = "nats://127.0.0.1:1"  # recorded, and nothing answers there (a server starting, or gone)
        version, st = await said(feed, version)
        assert (st["via"], st["reason"]) == ("tables", "nothing answers at nats://127.0.0.1:1")
        await asyncio.sleep(20 * FAST_S)  # asked again and again: the same answer is not said again
        assert feed.version == version
        named["url"] = None
        version, st = await said(feed, version)
        assert (st["live"], st["via"], st["reason"]) == (True, "tables", live.NO_SERVER)
        await asyncio.sleep(20 * FAST_S)
        assert feed.version == version

    feed_over(root, lambda: named["url"], body)


def test_a_feed_given_no_server_polls_and_a_named_one_not_answering_is_said_with_its_password_hidden(fast, tmp_path):
    root = tmp_path / "root"
    root.mkdir()

    async def none_given(feed, reader) -> None:
        assert (feed.status()["via"], feed.status()["reason"]) == ("tables", "no NATS server given")

    async def named(feed, reader) -> None:
        while feed.status()["reason"] == "looking for the NATS server":
            await asyncio.sleep(FAST_S)
        st = feed.status()
        assert (st["live"], st["via"], st["reason"]) == (True, "tables", "nothing answers at nats://ui:***@127.0.0.1:1")

    feed_over(root, None, none_given)
    feed_over(root, "nats://ui:s3cret@127.0.0.1:1", named)


def test_the_roots_server_is_the_one_recorded_while_its_process_lives_read_again_at_each_call(tmp_path):
    """What the dashboard follows with no server named (`live.root_server`, asked at each look): the URL the
    root's embedded default (or `nats up`) recorded, only while that server's process lives, and the new one
    once the next server records another port."""
    root = tmp_path / "root"
    server = live.root_server(root)
    assert server() is None  # a root that never had a server: none (not nats://127.0.0.1:4222)
    d = settings.nats_dir(root)
    d.mkdir(parents=True)
    (d / "url").write_text("nats://127.0.0.1:4333\n")
    assert server() is None  # a URL and no process: nothing runs
    (d / "nats-server.pid").write_text(str(os.getpid()))  # (a process that lives: this one)
    assert server() == "nats://127.0.0.1:4333"
    (d / "url").write_text("nats://127.0.0.1:4444\n")  # it stopped when idle; the next run's server took another port
    assert server() == "nats://127.0.0.1:4444"
    (d / "nats-server.pid").write_text(str(2**31 - 1))  # (no such process)
    assert server() is None
