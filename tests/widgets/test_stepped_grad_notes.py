"""A retained grad's note while its call is stepped: the value at the step shown, kept through a
redraw of the marks, and the call's own once stepping is over (06_retain_grad.py)."""

from __future__ import annotations

from tests.widgets.test_label_placement import _rect, example_calls, scene_faults  # noqa: F401
from widgets.export import graph_export as export


def test_a_retained_grad_note_reads_the_step_shown(example_calls):
    call = example_calls["06_retain_grad"]
    hidden = next(n.id for n in call.nodes if n.label == "hidden")
    with export.offscreen_view(call, values=True) as view:
        assert view.note_lines(hidden) == ["hidden.grad = 3"]  # after the call
        view.set_leaf_lines({}, replace=True)
        view.set_step_grads({})  # stepping, before hidden's node ran
        assert view.note_lines(hidden) == ["hidden.grad = None"]
        note = next(t for t in view.marks.tags if getattr(t, "grad_note", False))
        assert _rect(note.text_rect()) == (-61.265625, 131.0, 37.734375, 147.0)
        view.redraw_marks()  # a toggle rebuilds the marks: still the step's value
        assert view.note_lines(hidden) == ["hidden.grad = None"]
        view.set_step_grads({"x": {"numel": 1, "data": [99.0]}, "hidden": {"numel": 1, "data": [3.0]}})
        assert view.note_lines(hidden) == ["hidden.grad = 3"]
        assert scene_faults(view) == []
        view.set_step_grads({})
        view.clear_states()  # stepping over: the call's own
        assert view.note_lines(hidden) == ["hidden.grad = 3"]
        assert view.step_grads() is None
