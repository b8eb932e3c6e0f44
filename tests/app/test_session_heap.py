"""A big trace settles the heap when it arrives: later full collections skip its objects."""

import gc
import weakref

import pytest

from app.session.session import SETTLE_NODES, settle_heap
from core.model.trace import Trace
from tests.fixtures_graphs import mul_call, residual_mlp_call


class Cycle:
    pass


@pytest.mark.slow
def test_big_trace_freezes_what_survives_and_releases_it_at_the_next_one():
    gc.unfreeze()
    try:
        assert not settle_heap(None)
        assert not settle_heap(Trace(calls=[mul_call()]))
        assert gc.get_freeze_count() == 0

        blocks = SETTLE_NODES // 6 + 1
        big = Trace(calls=[residual_mlp_call(blocks)])
        assert len(big.calls[0].nodes) >= SETTLE_NODES

        holder = [Cycle()]
        holder[0].me = holder[0]
        ref = weakref.ref(holder[0])
        assert settle_heap(big)
        assert gc.get_freeze_count() > len(big.calls[0].nodes)

        # Dropped after the freeze: a full collection does not walk frozen objects.
        holder.clear()
        gc.collect()
        assert ref() is not None

        # The next big trace unfreezes first, so the previous heap's garbage goes.
        assert settle_heap(Trace(calls=[residual_mlp_call(blocks)]))
        assert ref() is None

        # A small trace after a big one unfreezes and collects, and freezes nothing.
        holder.append(Cycle())
        holder[0].me = holder[0]
        ref = weakref.ref(holder[0])
        gc.freeze()
        holder.clear()
        assert not settle_heap(Trace(calls=[mul_call()]))
        assert ref() is None and gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
