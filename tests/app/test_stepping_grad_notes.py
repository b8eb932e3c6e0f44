"""Stepping tells the truth on non-leaves too: a retained grad's note on its node follows the step
log, "hidden.grad = None" until hidden's node has run, then the value that step recorded."""

from pathlib import Path

import pytest

from tests.app.test_stepping_truth import _logged_grads

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "resources" / "examples"


@pytest.mark.slow
def test_a_retained_grad_note_follows_the_step_log_node_by_node(qtbot, window):
    window.open_script(str(EXAMPLES / "06_retain_grad.py"), run=False)
    window.act_values.setChecked(True)
    session = window.session
    with qtbot.waitSignal(session.sig_paused, timeout=60_000):
        window.act_debug.trigger()
    assert window.graph.wait_ready()
    call = window.call
    names = {n.id: n.label for n in call.nodes}
    hidden = next(nid for nid, label in names.items() if label == "hidden")
    assert window.graph.note_lines(hidden) == ["hidden.grad = None"]  # before backward: none yet
    seen = []
    for count in range(1, call.node_count + 1):
        signal = session.sig_paused if count < call.node_count else session.sig_step_end
        with qtbot.waitSignal(signal, timeout=20_000):
            window.act_step.trigger()
        qtbot.waitUntil(lambda: window.step_log.count() == count, timeout=5_000)
        logged = _logged_grads(window)
        note = window.graph.note_lines(hidden)
        assert note == [f"hidden.grad = {logged['hidden']}" if "hidden" in logged else "hidden.grad = None"], count
        seen.append((names[session.steps[-1]["node"]], note[0]))
    assert seen == [("out", "hidden.grad = None"), ("other_hidden", "hidden.grad = None"),
                    ("hidden", "hidden.grad = 3"), ("x", "hidden.grad = 3")]
