"""Stepping tells the truth: leaf chips follow the step log, and Continue says what it does."""

import re
from pathlib import Path

import pytest

from app.session.session import SessionState

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
