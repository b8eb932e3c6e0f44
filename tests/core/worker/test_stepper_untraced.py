"""The stepper's own hooks run without the thread's trace function; the user's hooks keep it."""

import sys

import torch

from core.worker.stepper import step_all

OWN = {"hook", "_values", "_gate", "_finish", "_take_open", "_running_on", "_leaf_values", "_full", "_key"}


def test_a_trace_function_sees_the_users_hooks_and_none_of_the_steppers():
    calls: list[tuple[str, str]] = []

    def tracer(frame, event, arg):
        if event == "call":
            calls.append((frame.f_code.co_filename, frame.f_code.co_name))
        return None

    seen = []

    def users_hook(grad):
        seen.append(float(grad.sum()))

    x = torch.ones(3, requires_grad=True)
    y = x * 2
    y.register_hook(users_hook)
    loss = (y * y).sum()
    sys.settrace(tracer)
    try:
        _, steps = step_all([loss], lambda: loss.backward())
    finally:
        sys.settrace(None)
    assert [s["name"] for s in steps] == ["SumBackward0", "MulBackward0", "MulBackward0", "AccumulateGrad"]
    assert x.grad.tolist() == [8.0, 8.0, 8.0]
    assert seen == [12.0]
    stepper_frames = {name for path, name in calls if path.endswith("stepper.py")}
    assert stepper_frames & OWN == set(), stepper_frames & OWN
    assert ("users_hook" in {name for path, name in calls if path == __file__})
    assert sys.gettrace() is None
