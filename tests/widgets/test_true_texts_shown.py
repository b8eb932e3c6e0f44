"""The texts of the inspector and the graph, from real captures, say exactly what happened."""

from __future__ import annotations

from core.model.trace_json import trace_from_json
from tests.core.model.test_true_texts import cross_entropy_trace
from widgets.panels.inspector import InspectorPanel


def test_inspector_shows_ignore_index_as_the_script_wrote_it(qtbot, tmp_path):
    call = trace_from_json(cross_entropy_trace(tmp_path).to_json()).calls[0]
    inspector = InspectorPanel()
    qtbot.addWidget(inspector)
    inspector.show_node(call, next(n.id for n in call.nodes if n.name == "NllLossBackward0"))
    lines = inspector.text().splitlines()
    at = lines.index("ignore_index")
    assert lines[at + 1] == "= -100"
    assert "18446744073709551516" not in inspector.text()


def test_the_item_stub_of_the_breaking_example_names_its_variable_and_call(qtbot):
    from pathlib import Path

    from core.worker.capture.recorder import capture_script
    from widgets.export.graph_export import offscreen_view

    example = Path(__file__).resolve().parents[2] / "resources" / "examples" / "05_breaking_the_graph.py"
    call = capture_script(str(example)).calls[0]
    with offscreen_view(call) as view:
        cuts = sorted(" ".join(t.lines) for t in view.marks.tags if t.kind == "cut")
    assert cuts == ["✂ as_number = x.item() * 10 → 20", "✂ detached: made by .detach()",
                    "✂ under_no_grad: made under no_grad"]
