"""The window opens big and odd traces: a 100k-node chain or fan-in, module paths 3,000 deep,
megabyte names; each is shown (graph drawn, inspector filled) with what is laid out bounded."""

from dataclasses import replace

import pytest

from core.layout.groups import PAGE_MARK
from tests.big_calls import big_names, chain, deep_modules, fan_in, trace_of
from tests.fixtures_graphs import tensor
from widgets.graph.scene import tooltip

SHOWN_MS = 120_000  # each opens in seconds here; the bound only keeps a hang from stalling the suite


def _show(qtbot, window, call, **trace_fields):
    with qtbot.waitSignal(window.sig_trace_shown, timeout=SHOWN_MS):
        window.show_trace(replace(trace_of(call), **trace_fields))
    qtbot.waitUntil(lambda: not window.graph.is_pending(), timeout=SHOWN_MS)
    return window.graph.node_items


def test_a_100k_chain_opens_on_the_loss(qtbot, window):
    items = _show(qtbot, window, chain(100_000))
    assert len(items) == 1_000 + 99 and "n0" in items and f"group:{PAGE_MARK}100" in items
    assert window.inspector.text().startswith("MulBackward0")
    window.graph.expand_all()  # modules open; the pages stay folded
    qtbot.waitUntil(lambda: not window.graph.is_pending(), timeout=SHOWN_MS)
    assert len(window.graph.node_items) == 1_000 + 99
    window.graph.toggle_group(f"{PAGE_MARK}2")  # a page opens like a module
    qtbot.waitUntil(lambda: not window.graph.is_pending(), timeout=SHOWN_MS)
    assert len(window.graph.node_items) == 2_000 + 98 and "n1999" in window.graph.node_items


def test_a_node_with_100k_inputs_lists_its_first_hundred(qtbot, window):
    items = _show(qtbot, window, fan_in(100_000))
    assert len(items) == 1_000 + 100
    text = window.inspector.text()
    assert text.startswith("StackBackward0") and "input 99\ttorch::autograd::AccumulateGrad (w100)" in text.replace("\n", "\t")
    assert "… 99,900 more inputs" in text and "input 100\t" not in text.replace("\n", "\t")
    assert "… 99,900 more lines" in text  # the local derivative, one line per input
    assert len(text) < 20_000


def test_module_paths_3000_deep_open(qtbot, window):
    items = _show(qtbot, window, deep_modules(3_000))
    assert items and len(window.graph.group_items) <= 64


@pytest.mark.parametrize("size", [10**6])
def test_a_megabyte_name_is_shown_cut(qtbot, window, size):
    items = _show(qtbot, window, big_names(size), tensors=[tensor("t9", "y" * size, [2])])
    assert set(items) == {"n0", "n1"}
    boxes = window.graph.graph_layout().nodes
    assert boxes["n1"].label == "x" * 39 + "…" + "x" * 40 + "\nshape 3" and boxes["n1"].w < 1_000
    assert len(tooltip(window.call, "n0")) < 3_000
    assert window.tensors.tree.topLevelItem(0).text(0) == "y" * 200 + "… (999,800 more characters; Copy takes all)"
    text = window.inspector.text()
    assert len(text) < 20_000 and "more characters; Copy takes all)" in text
    window.inspector.show_tensor(window.call, "t0")
    text = window.inspector.text()
    assert len(text) < 20_000 and text.startswith("x" * 200 + "… (999,800 more characters; Copy takes all)")
    assert window.trace.calls[0].tensors[0].name == "x" * size  # the trace keeps it whole
