"""The Emitter's own bookkeeping, without a server: what goes in each message, and the acked bound."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import emitter as em_mod
from ledger.emitter import Emitter

NO_SERVER = "nats://127.0.0.1:1"  # never connected to
KINDS = {"step": {"loss": 1.0, "grad_norm": 1.0, "lr": 1e-3, "tokens": 8, "step_time_s": 0.1},
         "eval": {"loss": 2.0}}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=300), st.integers(0, 2**32), st.integers(1, 64),
       st.integers(100, 20_000))
def test_messages_and_acks_in_any_order_account_for_every_event(tmp_path_factory, kinds, seed, max_batch, max_bytes):
    """Mixed kinds; messages acked in a random order, some twice (sent again after a timeout):
    each message holds one kind in seq order, and at the end every event is acked exactly once."""
    rng = random.Random(seed)
    saved = em_mod.MAX_BATCH_EVENTS, em_mod.MAX_BATCH_BYTES, Emitter._thread_main
    em_mod.MAX_BATCH_EVENTS, em_mod.MAX_BATCH_BYTES = max_batch, max_bytes
    Emitter._thread_main = lambda self: self._stopped.set()  # no publisher: this test takes and acks
    em = Emitter("run-1", "worker-0", 0, NO_SERVER, tmp_path_factory.mktemp("spool"), batch=True)
    try:
        for k in kinds:
            em.emit(k, KINDS[k], step=None)
        messages = []
        while em._pending:
            for items in em._take():
                assert len({i.kind for i in items}) == 1 and len(items) <= max_batch
                assert len(items) == 1 or sum(len(i.data) for i in items) < max_bytes
                assert [i.seq for i in items] == sorted(i.seq for i in items)
                messages.append(items)
        assert sorted(i.seq for m in messages for i in m) == list(range(len(kinds)))
        order = messages + rng.sample(messages, len(messages) // 3)  # some acked twice
        rng.shuffle(order)
        for items in order:
            em._mark_acked(items)
        assert em._acked_upto == len(kinds) and not em._acked
        assert em._unacked_bytes == 0 and em.pending() == 0
    finally:
        em_mod.MAX_BATCH_EVENTS, em_mod.MAX_BATCH_BYTES, Emitter._thread_main = saved
        em.close(0.01)
