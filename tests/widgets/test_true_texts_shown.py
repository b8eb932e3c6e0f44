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
