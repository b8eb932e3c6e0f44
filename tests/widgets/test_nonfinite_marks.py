"""The NaN/Inf check's findings in the window: a mark on the node of the first op whose output was
not finite and on the first backward node whose gradient was not, one problem for each, which
selects that node in its call; Run > Check for NaN/Inf runs the script with the check on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from core.model.trace import Trace
from tests.fixtures_graphs import call as make_call
from tests.fixtures_graphs import leaf, node, tensor
from core.model.nan_check import hold_nan_check
from widgets.panels.problems import ProblemsPanel

EXAMPLES = Path(__file__).resolve().parents[2] / "resources" / "examples"

FORWARD_TEXT = "log at line 7 in act (torch.log(h)): 1 of 4 values -inf; input h in [0, 3]"
BACKWARD_TEXT = "MulBackward0 (line 8, call #0, node n1): its gradient for input 0 has 1 of 4 values nan"


def _trace(backward_node: str = "n1") -> Trace:
    """``h = x``; ``a = torch.log(h)`` at line 7 in module act (x holds a 0); ``b = a * 2`` at line
    8; ``loss = b.sum()`` at line 9; the check found log's -inf and a NaN in MulBackward0's gradient."""
    nodes = [node("n0", "SumBackward0", ["n1"], line=9), node("n1", "MulBackward0", ["n2", None], line=8),
             node("n2", "LogBackward0", ["n3"], line=7, module="act"), leaf("n3", "t0", "x")]
    call = make_call(nodes, [tensor("t0", "x", [4])], ["n0"])
    forward = {"op": "log", "text": "torch.log(h)", "line": 7, "module": "act", "output": 0, "shape": [4],
               "numel": 4, "nan": 0, "posinf": 0, "neginf": 1,
               "inputs": [{"position": 0, "name": "h", "shape": [4], "dtype": "float32", "min": 0.0, "max": 3.0}],
               "call": "c0", "node": "n2"}
    names = {"n1": ("MulBackward0", 8, None, "n2"), "n2": ("LogBackward0", 7, "act", "n3")}
    name, line, module, to = names[backward_node]
    backward = {"call": "c0", "node": backward_node, "name": name, "line": line, "module": module, "input": 0,
                "to": to, "shape": [4], "numel": 4, "nan": 1, "posinf": 0, "neginf": 0}
    return Trace(calls=[call], nan_check={"forward": forward, "backward": backward})


def _marks(view) -> list[tuple[str, str]]:
    return [(t.text, t.target) for t in view.marks.tags if t.kind == "nonfinite"]


def test_the_first_non_finite_op_and_gradient_are_marked_on_their_nodes(view):
    trace = _trace()
    hold_nan_check(trace)
    view.set_call(trace.calls[0], sync=True)
    assert _marks(view) == [("first -inf: log (line 7)", "n2"), ("first NaN gradient: MulBackward0", "n1")]
    tips = [t.toolTip() for t in view.marks.tags if t.kind == "nonfinite"]
    assert tips == [f"First non-finite value: {FORWARD_TEXT}. This node is the op's.",
                    f"First non-finite gradient: {BACKWARD_TEXT}."]
    assert view.legend.entries() == ["op", "leaf", "frame", "nonfinite"]  # act is a module frame


def test_both_findings_on_one_node_are_two_marks_side_by_side(view):
    trace = _trace("n2")
    hold_nan_check(trace)
    view.set_call(trace.calls[0], sync=True)
    assert _marks(view) == [("first -inf: log (line 7)", "n2"), ("first NaN gradient: LogBackward0", "n2")]
    first, second = (t.sceneBoundingRect() for t in view.marks.tags if t.kind == "nonfinite")
    assert first.right() < second.left() and first.center().y() == second.center().y()


def test_a_trace_without_the_check_has_no_marks(view):
    trace = replace(_trace(), nan_check=None)
    hold_nan_check(trace)
    view.set_call(trace.calls[0], sync=True)
    assert _marks(view) == [] and "nonfinite" not in view.marks.legend()


@pytest.fixture
def problems(qtbot):
    panel = ProblemsPanel()
    qtbot.addWidget(panel)
    return panel


def test_problems_lists_each_finding_where_it_happened(problems):
    problems.set_trace(_trace())
    rows = [(problems.tree.topLevelItem(r).text(0), problems.tree.topLevelItem(r).text(1))
            for r in range(problems.tree.topLevelItemCount())]
    assert rows == [(f"first non-finite value: {FORWARD_TEXT}", "line 7 · call #0"),
                    (f"first non-finite gradient: {BACKWARD_TEXT}", "line 8 · call #0")]
    assert [(p.call, p.node, p.line) for p in problems.problems()] == [("c0", "n2", 7), ("c0", "n1", 8)]
    problems.tree.setCurrentItem(problems.tree.topLevelItem(1))
    assert problems.current_text() == f"First non-finite gradient: {BACKWARD_TEXT}"
    said = []
    problems.sig_call_selected.connect(lambda c: said.append(("call", c)))
    problems.sig_node_selected.connect(lambda n: said.append(("node", n)))
    problems.sig_line_activated.connect(lambda n: said.append(("line", n)))
    problems.tree.itemActivated.emit(problems.tree.topLevelItem(0), 0)
    assert said == [("call", "c0"), ("node", "n2"), ("line", 7)]


def test_a_trace_without_the_check_lists_no_finding(problems):
    trace = replace(_trace(), nan_check=None)
    problems.set_trace(trace)
    assert problems.count() == 0


def test_activating_a_finding_in_the_window_selects_its_node(qtbot, window):
    with qtbot.waitSignal(window.sig_trace_shown, timeout=60_000):
        window.show_trace(_trace())
    assert [t for t, _ in _marks(window.graph)] == ["first -inf: log (line 7)", "first NaN gradient: MulBackward0"]
    window.problems.tree.itemActivated.emit(window.problems.tree.topLevelItem(1), 0)
    assert window.session.selected == "n1" and window.graph.shown_selection() == "n1"
    window.problems.tree.itemActivated.emit(window.problems.tree.topLevelItem(0), 0)
    assert window.session.selected == "n2" and window.graph.shown_selection() == "n2"


@pytest.mark.slow
def test_run_with_the_check_on_marks_the_first_nan_of_a_hand_written_loss(qtbot, window):
    assert not window.session.nan_check
    window.act_nan_check.setChecked(True)
    assert window.session.nan_check
    with qtbot.waitSignal(window.sig_trace_shown, timeout=120_000):
        window.open_script(str(EXAMPLES / "33_first_nan.py"))
    trace = window.session.trace
    assert trace.nan_check is not None
    rows = [(p.summary, p.where) for p in window.problems.problems()]
    assert rows == [
        ("first non-finite value: log at line 25 (torch.log(q)): 1 of 3 values -inf; input q in [0, 0.924142]",
         "line 25 · call #0"),
        ("first non-finite gradient: LogBackward0 (line 25, call #0, node n12): its gradient for input 0 has "
         "1 of 3 values nan", "line 25 · call #0"),
    ]
    assert _marks(window.graph) == [("first -inf: log (line 25)", "n12"), ("first NaN gradient: LogBackward0", "n12")]
    assert window.call.node("n12").name == "LogBackward0" and window.call.node("n12").line == 25


def test_the_run_menus_check_turns_the_check_on_for_plain_runs_only(window, monkeypatch):
    asked = []
    monkeypatch.setattr(window.session.handle, "run", lambda path, **kw: asked.append(kw.get("nan_check")) or 1)
    window.session.script_path = str(EXAMPLES / "33_first_nan.py")
    run_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Run")
    assert window.act_nan_check in run_menu.actions() and window.act_nan_check.text() == "Check for &NaN/Inf"
    window.session.run()
    window.act_nan_check.setChecked(True)
    window.session.run()
    window.session.debug()
    window.act_nan_check.setChecked(False)
    window.session.run()
    assert asked == [None, True, None, None]


def test_the_windows_nan_check_option():
    from app.cli.commands import build_parser

    parser = build_parser()
    assert parser.parse_args(["open", "s.py", "--nan-check"]).nan_check is True
    assert parser.parse_args(["open", "s.py"]).nan_check is False
