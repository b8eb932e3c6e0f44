"""Stepping tells the truth: leaf chips follow the step log, and Continue says what it does."""

import re
from pathlib import Path

import pytest

from app.session.session import SessionState
from core.protocol import messages as protocol
from core.model.trace_json import call_to_dict

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "resources" / "examples"
LOGGED = re.compile(r"([\w.]+)\.grad = (.+?)(?=, [\w.]+\.grad = |$)")


def _logged_grads(window) -> dict[str, str]:
    """Each leaf's latest .grad as the step log writes it."""
    out = {}
    for row in range(window.step_log.count()):
        text = window.step_log.row_texts(row)[3]
        if "   → " in text:
            for name, value in LOGGED.findall(text.split("   → ", 1)[1]):
                out[name] = value
    return out


@pytest.mark.slow
def test_leaf_chips_follow_the_step_log_node_by_node(qtbot, window):
    window.open_script(str(EXAMPLES / "13_mlp_classifier.py"), run=False)
    window.act_values.setChecked(True)
    session = window.session
    with qtbot.waitSignal(session.sig_paused, timeout=60_000):
        window.act_debug.trigger()
    assert window.graph.wait_ready()
    call = window.call
    leaves = {n.id: n.label for n in call.nodes if n.kind == "accumulate_grad"}
    assert set(leaves.values()) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    chips = {nid: window.graph.leaf_chip(nid) for nid in leaves}
    assert all(chips.values()), chips  # every leaf has its chip: the call is small enough to show all
    # Before backward of the first call, no leaf has a .grad.
    assert {nid: lines[-1] for nid, lines in chips.items()} == dict.fromkeys(leaves, ".grad = None")
    ran_leaves = 0
    for count in range(1, call.node_count + 1):
        done = len(session.steps)
        if count < call.node_count:
            with qtbot.waitSignal(session.sig_paused, timeout=20_000):
                window.act_step.trigger()
        else:
            with qtbot.waitSignal(session.sig_step_end, timeout=20_000):
                window.act_step.trigger()
        assert len(session.steps) == done + 1 == count
        qtbot.waitUntil(lambda: window.step_log.count() == count, timeout=5_000)
        logged = _logged_grads(window)
        record = session.steps[-1]
        if record["node"] in leaves:
            ran_leaves += 1
            assert leaves[record["node"]] in logged  # the log says what this AccumulateGrad left
        for nid, name in leaves.items():
            lines = window.graph.leaf_chip(nid)
            assert lines[0].startswith(f"{name} = "), lines
            expected = f".grad = {logged[name]}" if name in logged else ".grad = None"
            assert lines[-1] == expected, (count, record["name"], name, lines)
    assert ran_leaves == 4
    assert "fc2.bias" in _logged_grads(window)


@pytest.mark.slow
def test_replaying_a_step_shows_the_leaf_chips_of_that_step(qtbot, window):
    window.open_script(str(EXAMPLES / "13_mlp_classifier.py"), run=False)
    window.act_values.setChecked(True)
    session = window.session
    with qtbot.waitSignal(session.sig_paused, timeout=60_000):
        window.act_debug.trigger()
    assert window.graph.wait_ready()
    call = window.call
    with qtbot.waitSignal(session.sig_step_end, timeout=20_000):
        window.act_continue.trigger()
    steps = list(session.steps)
    assert len(steps) == call.node_count
    first_leaf = next(i for i, s in enumerate(steps) if s.get("leaf_grads") and s["node"] in
                      {n.id for n in call.nodes if n.kind == "accumulate_grad"})
    leaf = steps[first_leaf]["node"]
    name = call.node(leaf).label
    window.step_log.sig_step_selected.emit(first_leaf)  # before that leaf's step: no .grad yet
    assert window.graph.leaf_chip(leaf)[-1] == ".grad = None"
    window.step_log.sig_step_selected.emit(first_leaf + 1)  # its step: the .grad it recorded
    assert window.graph.leaf_chip(leaf)[-1] == f".grad = {_logged_grads(window)[name]}"


# -- Continue's progress, driven by the worker's messages (no worker needed) --------------------------------


def _small_call(n: int):
    """A chain of ``n`` nodes, the last a leaf's AccumulateGrad."""
    from core.model.trace import CallInfo, Edge, NodeInfo

    nodes = [NodeInfo(id=f"n{i}", name="MulBackward0", kind="op", next=[Edge(f"n{i + 1}", 0)] if i + 1 < n else [])
             for i in range(n - 1)]
    nodes.append(NodeInfo(id=f"n{n - 1}", name="AccumulateGrad", kind="accumulate_grad", label="w", next=[]))
    return CallInfo(id="c0", index=0, api="Tensor.backward", line=3, nodes=nodes, roots=["n0"], tensors=[],
                    node_count=n)


class _FakeHandle:
    """Stands in for the window's handle: the session sends controls, the test sends messages."""

    def __init__(self, handle):
        self.handle = handle
        self.sent = []

    def control(self, cmd, **args):
        self.sent.append((cmd, args))


def _paused_session(window, monkeypatch, n):
    window.open_script(str(EXAMPLES / "01_multiply.py"), run=False)  # a script open: the actions are on
    session = window.session
    fake = _FakeHandle(window.handle)
    monkeypatch.setattr(window.handle, "control", fake.control)
    call = _small_call(n)
    session.run_id, session.run_kind = 77, "debug"
    window.handle.current_run = 77
    session._set_state(SessionState.DEBUGGING)
    window.handle.sig_step_begin.emit(protocol.StepBegin(call=0, api="Tensor.backward", line=3,
                                                         graph=call_to_dict(call), debug=True))
    window.handle.sig_step_paused.emit(protocol.StepPaused(call=0, pending={"node": "n0", "grad_outputs": []}))
    assert session.state is SessionState.PAUSED
    return session, fake


def _records(start, stop):
    return [{"index": i, "node": f"n{i}", "name": "MulBackward0", "grad_outputs": [], "grad_inputs": []}
            for i in range(start, stop)]


def test_continue_shows_its_progress_and_never_a_queued_step(qtbot, window, monkeypatch):
    session, fake = _paused_session(window, monkeypatch, 4802)
    assert "F5 continues" in window.step_log.status.text()
    window.act_continue.trigger()
    assert fake.sent == [("continue", {})]
    assert session.state is SessionState.STEPPING
    # Only F5 was pressed: nothing is queued, and neither the button nor the status says so.
    assert window.act_step.iconText() == "Step"
    assert window.step_log.status.text() == "Call #0: continuing: 0 / 4,802 nodes"
    window.handle.sig_steps.emit(protocol.Steps(call=0, records=_records(0, 1234)))
    qtbot.waitUntil(lambda: window.step_log.status.text() == "Call #0: continuing: 1,234 / 4,802 nodes",
                    timeout=5_000)
    window.handle.sig_steps.emit(protocol.Steps(call=0, records=_records(1234, 3000)))
    qtbot.waitUntil(lambda: window.step_log.status.text() == "Call #0: continuing: 3,000 / 4,802 nodes",
                    timeout=5_000)
    assert window.act_step.iconText() == "Step"
    # A Step pressed meanwhile is kept for the next pause, and both say so.
    window.act_step.trigger()
    assert fake.sent == [("continue", {})]
    assert window.act_step.iconText() == "Step (1 queued)"
    assert window.step_log.status.text() == ("Call #0: continuing: 3,000 / 4,802 nodes; 1 step press waits "
                                            "for the next pause")


def test_step_to_shows_where_it_runs(qtbot, window, monkeypatch):
    session, fake = _paused_session(window, monkeypatch, 30)
    session.step_to("n20")
    assert fake.sent == [("step_to", {"node": "n20"})]
    assert window.step_log.status.text() == "Call #0: running to MulBackward0: 0 / 30 nodes"
    assert window.act_step.iconText() == "Step"
    window.handle.sig_steps.emit(protocol.Steps(call=0, records=_records(0, 12)))
    qtbot.waitUntil(lambda: window.step_log.status.text() == "Call #0: running to MulBackward0: 12 / 30 nodes",
                    timeout=5_000)
    window.handle.sig_step_paused.emit(protocol.StepPaused(call=0, pending={"node": "n20", "grad_outputs": []}))
    assert window.step_log.status.text().startswith("Call #0, step 12: paused before MulBackward0")


@pytest.mark.slow
def test_stepping_a_traced_call_shows_each_leaf_grad_only_once_its_step_ran(qtbot, window):
    # The traced call holds the grads after backward; stepping it again starts from before.
    with qtbot.waitSignal(window.sig_trace_shown, timeout=60_000):
        window.open_script(str(EXAMPLES / "01_multiply.py"))
    window.act_values.setChecked(True)
    call = window.call
    leaf_a = next(n.id for n in call.nodes if n.label == "a")
    assert window.graph.leaf_chip(leaf_a) == ["a = 2", ".grad = 3"]  # after the traced backward
    session = window.session
    window.act_step.trigger()  # a re-run to this call, and its first node
    qtbot.waitUntil(lambda: session.state is SessionState.PAUSED and len(session.steps) == 1, timeout=60_000)
    assert session.steps[0]["name"] == "MulBackward0"
    assert window.graph.leaf_chip(leaf_a) == ["a = 2", ".grad = None"]
    with qtbot.waitSignal(session.sig_step_end, timeout=20_000):
        window.act_continue.trigger()
    assert window.graph.leaf_chip(leaf_a) == ["a = 2", ".grad = 3"]
    assert _logged_grads(window)["a"] == "3"
