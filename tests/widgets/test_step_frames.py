"""A step redraws only what it changed; Continue ends where stepping every node ends; the
current node is kept in view (folds around it open once stepping rests)."""

import textwrap
from pathlib import Path

import pytest

from app.session.session import SessionState
from core.protocol.messages import StepperState
from widgets.panels.calls import CALL_ID_ROLE

ROOT = Path(__file__).resolve().parents[2]

# 12 blocks of Linear(2, 2) + tanh: 62 nodes, every gradient at most 4 values, so a preview made
# while backward runs on (Continue) holds every value, as a single step's does.
CHAIN = textwrap.dedent("""\
    import torch
    from torch import nn
    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(2, 2), nn.Tanh()) for _ in range(12)])
    x = torch.randn(1, 2)
    loss = blocks(x).pow(2).sum()
    loss.backward()
    (blocks(x) * 3).sum().backward()
""")


def _debug(qtbot, window, tmp_path):
    script = tmp_path / "chain.py"
    script.write_text(CHAIN)
    window.open_script(str(script), run=False)
    with qtbot.waitSignal(window.session.sig_paused, timeout=60_000):
        window.act_debug.trigger()
    assert window.graph.wait_ready()
    assert window.call.node_count == 62
    return window.session


def _step(qtbot, window):
    with qtbot.waitSignal(window.session.sig_paused, timeout=10_000):
        window.act_step.trigger()


def _drawn(graph):
    return ({v: i.state for v, i in graph.node_items.items()},
            {id(e): e.value_text for e in graph.edge_items})


def _in_view(graph, box_id):
    seen = graph.mapToScene(graph.viewport().rect()).boundingRect()
    return seen.contains(graph.node_items[box_id].sceneBoundingRect())


@pytest.mark.slow
def test_a_step_touches_only_the_items_it_changed_and_keeps_the_node_in_view(qtbot, window, tmp_path):
    session = _debug(qtbot, window, tmp_path)
    graph = window.graph
    assert len(graph.node_items) == 62 and len(graph.edge_items) >= 60  # every node drawn: no fold
    for _ in range(4):
        nodes_before, edges_before = _drawn(graph)
        updates = graph.item_updates
        _step(qtbot, window)
        nodes_after, edges_after = _drawn(graph)
        changed_nodes = [v for v in nodes_after if nodes_after[v] != nodes_before[v]]
        changed_edges = [e for e in edges_after if edges_after[e] != edges_before[e]]
        # the node that ran and the next one changed (and any node whose gradient became complete)
        executed = session.steps[-1]["node"]
        assert nodes_after[executed] == "executed" and nodes_after[session.pending["node"]] == "current"
        assert {executed, session.pending["node"]} <= set(changed_nodes)
        assert len(changed_nodes) <= 4 and 1 <= len(changed_edges) <= 3
        # one update per changed item, not one per item of the graph (a full pass: 120+)
        assert graph.item_updates - updates == len(changed_nodes) + len(changed_edges)
    # The view's states are what recomputing them from every step gives.
    from core.model.step_state import step_view

    full = step_view(window.call, session.steps, session.pending)
    assert graph.node_states() == full.states

    # Zoomed in on the loss, the leaves of the first block are out of sight; stepping to one of
    # them brings it into view.
    # the second block's weight: its leaf runs late, before the first block's nodes
    target = next(n.id for n in window.call.nodes if n.label == "1.0.weight")
    graph.set_zoom(250)
    graph.centerOn(graph.node_items[window.call.roots[0]])
    assert not _in_view(graph, target)
    with qtbot.waitSignal(session.sig_paused, timeout=10_000):
        session.step_to(target)
    assert session.pending["node"] == target and graph.node_items[target].state == "current"
    assert _in_view(graph, target)

    # Folded: the module's box is current and in view at once; the fold opens when stepping rests.
    graph.collapse_all(sync=True)
    _step(qtbot, window)
    current = session.pending["node"]
    box = graph.box_of(current)
    assert box.startswith("group:") and graph.node_items[box].state == "current" and _in_view(graph, box)
    qtbot.waitUntil(lambda: graph.box_of(current) == current, timeout=10_000)
    assert graph.wait_ready()
    assert graph.node_items[current].state == "current" and _in_view(graph, current)
    # the new scene does not take the inspector back to the loss: it describes the current node
    qtbot.waitUntil(lambda: window.inspector.text().splitlines()[0] == window.call.node(current).name,
                    timeout=5_000)
    assert graph.node_states() == step_view(window.call, session.steps, session.pending).states


def _finish(qtbot, window, drive):
    """Run ``drive`` and return what the graph shows when the call's backward ends."""
    session, graph = window.session, window.graph
    seen = {}

    def at_end(event):
        seen.update(state=event["state"], nodes=graph.node_states(), edges=graph.edge_texts(),
                    items={v: i.state for v, i in graph.node_items.items()},
                    leaf_grads=dict(session.tracker.leaf_grads), steps=[s["node"] for s in session.steps])

    session.sig_step_end.connect(at_end)
    try:
        drive()
        qtbot.waitUntil(lambda: "state" in seen, timeout=30_000)
    finally:
        session.sig_step_end.disconnect(at_end)
    return seen


@pytest.mark.slow
def test_continue_ends_where_stepping_every_node_ends(qtbot, window, tmp_path):
    session = _debug(qtbot, window, tmp_path)
    continued = _finish(qtbot, window, window.act_continue.trigger)
    qtbot.waitUntil(lambda: session.state is SessionState.PAUSED and session.step_call.index == 1, timeout=30_000)

    from core.protocol.switch_interval import stepping_switch

    assert stepping_switch()  # paused: a 0.5 ms GIL switch interval (core/protocol/switch_interval.py)
    window.act_stop.trigger()  # and a new debug run, paused before call 0's first node
    qtbot.waitUntil(lambda: not window.handle.running, timeout=10_000)
    qtbot.waitUntil(lambda: not stepping_switch(), timeout=10_000)  # stopped: the default is back
    with qtbot.waitSignal(session.sig_paused, timeout=60_000):
        window.act_debug.trigger()
    assert session.step_call.index == 0 and session.steps == []

    def step_each():
        for _ in range(61):
            _step(qtbot, window)
        window.act_step.trigger()  # the last node: backward ends

    stepped = _finish(qtbot, window, step_each)
    assert continued["state"] == stepped["state"] == StepperState.FINISHED
    assert len(stepped["steps"]) == 62 and continued["steps"] == stepped["steps"]
    assert continued["nodes"] == stepped["nodes"] == {n.id: "executed" for n in window.call.nodes}
    assert continued["items"] == stepped["items"]
    assert continued["edges"] == stepped["edges"] and len(stepped["edges"]) >= 60
    assert continued["leaf_grads"] == stepped["leaf_grads"]
    assert len(stepped["leaf_grads"]) == 24 and all(v["data"] for v in stepped["leaf_grads"].values())


def test_deltas_draw_what_a_full_redraw_draws_with_folded_modules(qtbot):
    """Step by step, the boxes, edges, legend and overview marks drawn from deltas are those a
    full redraw from every step gives, on open nodes and on folded groups alike."""
    from core.model.step_state import StepTracker, step_texts, step_view
    from tests.fixtures_graphs import residual_mlp_call, step_record
    from widgets.graph.scene import overview_marks
    from widgets.graph.view import GraphView

    call = residual_mlp_call(blocks=6)
    views = []
    for _ in range(2):
        v = GraphView()
        v.resize(900, 700)
        qtbot.addWidget(v)
        v.set_call(call, sync=True, collapsed=frozenset({"layers.2", "layers.4.fc"}))
        views.append(v)
    live, ref = views
    assert {"group:layers.2", "group:layers.4.fc"} <= set(live.node_items)
    tracker, records = StepTracker(call), []
    for k, node in enumerate(call.nodes):  # preorder: every consumer before the node it feeds
        record = step_record(k, node)
        records.append(record)
        tracker.add(record)
        pending = {"node": call.nodes[k + 1].id} if k + 1 < len(call.nodes) else None
        tracker.set_current(pending["node"] if pending else None)
        delta = tracker.delta()
        before = live.item_updates
        live.update_step(delta.states, delta.edge_texts)
        assert live.item_updates - before <= len(delta.states) + 2 * len(delta.edge_texts) <= 12
        full = step_view(call, records, pending)
        ref.set_node_states(full.states)
        ref.set_edge_texts(step_texts(call, full))
        assert live.node_states() == full.states and live.edge_texts() == step_texts(call, full)
        assert {v: i.state for v, i in live.node_items.items()} == {v: i.state for v, i in ref.node_items.items()}
        assert [(e.key, e.value_text) for e in live.edge_items] == [(e.key, e.value_text) for e in ref.edge_items]
        assert live.legend.entries() == ref.legend.entries()
        assert live.overview.marks == overview_marks(live.node_items, None)
    # the folded block ran whole: its box reads executed; its edges carry gradients
    assert live.node_items["group:layers.2"].state == "executed"
    assert sum(bool(e.value_text) for e in live.edge_items) >= len(live.edge_items) - 2


@pytest.mark.slow
def test_a_debug_run_that_ends_opens_its_trace_on_the_call_last_stepped(qtbot, window, tmp_path):
    session = _debug(qtbot, window, tmp_path)
    with qtbot.waitSignal(session.sig_paused, timeout=30_000):
        window.act_continue.trigger()  # call 0's backward ends; the script pauses before call 1's
    assert session.step_call.index == 1
    shown = []
    session.sig_call.connect(lambda call: shown.append(call))
    window.act_continue.trigger()
    qtbot.waitUntil(lambda: not window.handle.running and session.state is SessionState.IDLE, timeout=30_000)
    # One graph drawn: the stepped call of the finished trace, not the trace's first call before it.
    assert [(c.index, c.snapshot) for c in shown] == [(1, "full")]
    assert shown[0] is window.call and shown[0] in session.trace.calls
    grads = shown[0].leaf_grads
    assert len(grads) == 24 and all(v.data for v in grads.values())
    assert window.calls.list.currentItem().data(CALL_ID_ROLE) == shown[0].id  # the calls list says so too
