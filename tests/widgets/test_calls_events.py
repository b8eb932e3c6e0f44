"""The Calls list names what the script did with the gradients after each call: clipping (norm
before → after), the optimizer's step with its largest update size, zero_grad; the tooltip gives
each event in full."""

from __future__ import annotations

from core.model.grad_health import event_brief
from core.model.trace import CallInfo, Trace
from widgets.panels.calls import DETAIL_ROLE, CallsPanel

CLIP = {"kind": "clip_grad_norm_", "after_call": 0, "line": 30, "max_norm": 1.0, "norm_type": 2.0,
        "total_norm": 886.25, "clip_coef": 0.0011283, "norm_after": 1.0, "params": 4}
STEP = {"kind": "optimizer.step", "after_call": 0, "line": 31, "optimizer": "SGD",
        "update": {"fc1": 0.0123, "fc2": 0.00041}}
ZERO = {"kind": "zero_grad", "after_call": 0, "line": 27}
UNDER = {**CLIP, "after_call": 1, "total_norm": 0.5, "clip_coef": 1.0, "norm_after": 0.5}
NAN_STEP = {**STEP, "after_call": 1, "update": {"fc1": "nan", "fc2": 0.1}}


def _trace() -> Trace:
    calls = [CallInfo(id=f"c{i}", index=i, api="Tensor.backward", line=29, roots=[], nodes=[], tensors=[],
                      node_count=3) for i in range(3)]
    return Trace(calls=calls, script="loop.py", call_count=3, grad_events=[CLIP, STEP, ZERO, UNDER, NAN_STEP])


def test_each_event_in_a_few_words():
    assert [event_brief(e) for e in (CLIP, STEP, ZERO, UNDER, NAN_STEP)] == [
        "clipped 886 → 1", "SGD.step ‖Δ‖/‖p‖ ≤ 0.0123", "zero_grad", "clip: norm 0.5 under max 1",
        "SGD.step ‖Δ‖/‖p‖ nan"]


def test_the_row_of_each_call_says_what_followed_it(qtbot):
    panel = CallsPanel()
    qtbot.addWidget(panel)
    panel.set_trace(_trace())
    items = [panel.list.item(r) for r in range(panel.list.count())]
    details = [i.data(DETAIL_ROLE).split(" · ") for i in items]
    assert details[0] == ["line 29", "3 nodes", "then clipped 886 → 1, SGD.step ‖Δ‖/‖p‖ ≤ 0.0123, zero_grad"]
    assert details[1][2] == "then clip: norm 0.5 under max 1, SGD.step ‖Δ‖/‖p‖ nan"
    assert not any(d.startswith("then ") for d in details[2])  # nothing followed the last call
    assert ("After this call:\nclip_grad_norm_ (line 30): max 1, norm 886 → 1 (× 0.00113)\n"
            "SGD.step (line 31): ‖Δ‖/‖param‖ fc1 0.0123, fc2 0.00041\nzero_grad (line 27)") in items[0].toolTip()
