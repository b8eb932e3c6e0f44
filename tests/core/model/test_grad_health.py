"""Module × call norms and the vanishing / exploding flags, on hand-made traces."""

import math

from core.model.grad_health import Flag, event_text, exploding, grad_health, norm_matrix, report, vanishing
from core.model.trace import CallInfo, Trace


def _call(index, modules, same_as=None):
    """A call whose params are reached last layer first, as backward reaches them."""
    params = {f"{m}.weight": {"module": m, "grad": n, "param": 1.0, "ratio": n} for m, n in reversed(modules.items())}
    return CallInfo(id=f"c{index}", index=index, api="Tensor.backward", line=10, roots=[], nodes=[], tensors=[],
                    snapshot="summary" if same_as else "full", same_as=same_as,
                    grad_norms={"params": params, "modules": dict(modules)})


def _trace(rows, events=()):
    return Trace(calls=[_call(i, r, "c0" if i else None) for i, r in enumerate(rows)], grad_events=list(events),
                 call_count=len(rows))


def test_matrix_rows_go_from_input_to_loss_and_columns_are_calls():
    trace = _trace([{"fc1": 0.5, "fc2": 2.0}, {"fc1": "inf", "fc2": None}])
    trace = Trace(calls=trace.calls + [CallInfo(id="c2", index=2, api="autograd.grad", line=3, roots=[], nodes=[],
                                                tensors=[])], call_count=3)
    m = norm_matrix(trace)
    assert (m.modules, m.calls) == (["fc1", "fc2"], [0, 1])  # the autograd.grad call has no norms
    assert m.values == [[0.5, math.inf], [2.0, None]]
    assert m.largest(1) == 0.0 and m.largest(0) == 2.0
    # the log colour scale spans 0.5 .. 2.0, i.e. log10 -0.301 .. 0.301
    assert m.log_range == (math.log10(0.5), math.log10(2.0))
    assert [m.shade(v) for v in (0.5, 1.0, 2.0, math.inf, 0.0, None, math.nan)] == [0.0, 0.5, 1.0, 1.0, 0.0, None, None]


def test_vanishing_names_the_module_and_the_first_call_under_the_ratio():
    m = norm_matrix(_trace([{"l0": 1e-2, "l1": 0.5, "head": 10.0},
                            {"l0": 9e-3, "l1": 0.5, "head": 10.0},
                            {"l0": 1.5e-3, "l1": 1e-3, "head": 2.0}]))
    # l1 at call 2 is 1e-3 / 2.0 = 5e-4 of the largest; l0 at call 0 exactly 1e-3, not under it
    assert vanishing(m) == [Flag("vanishing", "l0", 1, 2, 9e-3, 10.0), Flag("vanishing", "l1", 2, 1, 1e-3, 2.0)]
    assert vanishing(m, ratio=1e-4) == []
    assert vanishing(m)[0].text == "vanishing: l0 from call #1: norm 0.009, 0.0009 of the largest (10); in 2 calls"


def test_exploding_needs_a_rise_at_every_call_and_the_factor_overall():
    rows = [{"a": 1.0, "b": 1.0, "c": 1.0}, {"a": 2.0, "b": 9.0, "c": 3.0}, {"a": 3.0, "b": 8.0, "c": 10.0},
            {"a": 30.0, "b": 100.0, "c": "inf"}, {"a": "nan", "b": 1e4, "c": "nan"}]
    m = norm_matrix(_trace(rows))
    # a: 2 -> 3 -> 30 from call 1; b falls at call 2, then 8 -> 100 -> 1e4 from call 2; c: 1 -> 3 -> 10 from call 0
    assert exploding(m) == [Flag("exploding", "a", 1, 3, 2.0, 30.0), Flag("exploding", "b", 2, 3, 8.0, 1e4),
                            Flag("exploding", "c", 0, 3, 1.0, 10.0)]
    # a's 15x falls short of 20, and so does c's 1 -> 3 -> 10; c's 3 -> 10 -> inf does not
    assert exploding(m, factor=20.0) == [Flag("exploding", "b", 2, 3, 8.0, 1e4),
                                         Flag("exploding", "c", 1, 3, 3.0, math.inf)]
    # four calls: a's 1 -> 2 -> 3 -> 30, c's 1 -> 3 -> 10 -> inf; b fell at call 2
    assert [(f.module, f.call) for f in exploding(m, calls=4)] == [("a", 0), ("c", 0)]
    assert exploding(m)[0].text == "exploding: a from call #1: norm 2 → 30 over 3 calls"


def test_events_join_the_calls_they_follow_and_the_report_lists_them():
    clip = {"kind": "clip_grad_norm_", "after_call": 0, "line": 12, "max_norm": 1.0, "norm_type": 2.0,
            "total_norm": 12.5, "clip_coef": 0.08, "norm_after": 1.0, "params": 4}
    step = {"kind": "optimizer.step", "after_call": 0, "line": 13, "optimizer": "SGD", "update": {"fc2": 0.5, "fc1": None}}
    zero = {"kind": "zero_grad", "after_call": None, "line": 9}
    trace = _trace([{"fc1": 1e-5, "fc2": 1.0}, {"fc1": 1e-5, "fc2": 1.0}], [zero, clip, step])
    health = grad_health(trace)
    assert health.events == {None: [zero], 0: [clip, step]}
    assert event_text(clip) == "clip_grad_norm_ (line 12): max 1, norm 12.5 → 1 (× 0.08)"
    assert event_text(step) == "SGD.step (line 13): ‖Δ‖/‖param‖ fc1 -, fc2 0.5"
    assert report(trace).splitlines() == [
        "gradient norms: 2 modules × 2 calls",
        "module         #0         #1",
        "fc1         1e-05      1e-05",
        "fc2             1          1",
        "flags: 1",
        "  vanishing: fc1 from call #0: norm 1e-05, 1e-05 of the largest (1); in 2 calls",
        "after #0: clip_grad_norm_ (line 12): max 1, norm 12.5 → 1 (× 0.08)",
        "after #0: SGD.step (line 13): ‖Δ‖/‖param‖ fc1 -, fc2 0.5",
    ]
    assert report(Trace(calls=[])) == "gradient norms: none recorded"


def test_report_shows_the_first_and_last_calls_of_a_long_loop():
    trace = _trace([{"fc": float(i + 1)} for i in range(20)])
    assert report(trace, max_calls=4).splitlines()[1:3] == [
        "module         #0         #1        #18        #19",
        "fc              1          2         19         20",
    ]
