"""GradScaler steps: the loss scale each ran with, the steps inf/NaN skipped and the scale after update(),
compared with what the scaler itself reported in a plain run of the same script."""

import json
import re
import runpy
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from core.model.grad_health import grad_health, report, scaler_steps  # noqa: E402
from core.model.trace import TraceFormatError  # noqa: E402
from core.model.trace_json import trace_from_json  # noqa: E402
from core.worker.capture.recorder import capture_script  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "resources" / "examples" / "36_amp_skip.py"

LOOP = """\
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=2)
    x = torch.randn(8, 3)
    used, found, after, weights = [], [], [], []
    for step in range(5):
        opt.zero_grad()
        batch = x * 1e38 if step == 2 else x
        loss = model(batch).pow(2).mean()
        used.append(scaler.get_scale())
        scaler.scale(loss).backward()
        scaler.step(opt)
        found.append(sum(v.item() for v in scaler._per_optimizer_states[id(opt)]["found_inf_per_device"].values()))
        scaler.update()
        after.append(scaler.get_scale())
        weights.append(model.weight.detach().clone())
    scaler.scale(model(x).sum()).backward()
    scaler.step(opt)
"""


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    path = tmp_path_factory.mktemp("scaler") / "script.py"
    path.write_text(textwrap.dedent(LOOP))
    return capture_script(str(path)), runpy.run_path(str(path))


def test_each_step_records_the_scale_the_skip_and_the_scale_after_update(loop):
    trace, plain = loop
    assert trace.error is None
    assert plain["found"] == [0.0, 0.0, 1.0, 0.0, 0.0]  # the step on x * 1e38 found inf
    assert plain["used"] == [1024.0, 1024.0, 2048.0, 1024.0, 1024.0]  # grown after 2 clean steps, halved
    assert plain["after"] == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0]
    steps = [e for e in trace.grad_events if e["kind"] == "scaler.step"]
    assert steps == [{"kind": "scaler.step", "after_call": i, "line": 16, "optimizer": "SGD", "scale": used,
                      "skipped": bool(inf), "scale_after": after}
                     for i, (used, inf, after) in enumerate(zip(plain["used"], plain["found"], plain["after"]))] + \
        [{"kind": "scaler.step", "after_call": 5, "line": 22, "optimizer": "SGD", "scale": 2048.0, "skipped": False,
          "scale_after": None}]  # no update() after the last step
    assert torch.equal(plain["weights"][2], plain["weights"][1])  # the skipped step left the weights


def test_a_skipped_step_runs_no_optimizer_step(loop):
    trace, _ = loop
    kinds = [(e["after_call"], e["kind"]) for e in trace.grad_events if e["kind"] != "zero_grad"]
    assert kinds == [(0, "scaler.step"), (0, "optimizer.step"), (1, "scaler.step"), (1, "optimizer.step"),
                     (2, "scaler.step"), (3, "scaler.step"), (3, "optimizer.step"), (4, "scaler.step"),
                     (4, "optimizer.step"), (5, "scaler.step"), (5, "optimizer.step")]
    assert (torch.amp.GradScaler.step.__name__, torch.amp.GradScaler.update.__module__) == \
        ("step", "torch.amp.grad_scaler")  # restored after the run


def test_grad_health_lists_the_skipped_steps_and_the_report_prints_them(loop):
    trace, _ = loop
    health = grad_health(trace)
    assert [(s.call, s.line, s.scale, s.scale_after) for s in health.skipped] == [(2, 16, 2048.0, 1024.0)]
    assert health.skipped[0].note == "step skipped: inf/NaN in gradients, scale 2048 → 1024"
    assert [s.note for s in scaler_steps(trace)] == [
        "scale 1024", "scale 1024 → 2048", "step skipped: inf/NaN in gradients, scale 2048 → 1024",
        "scale 1024", "scale 1024 → 2048", "scale 2048"]
    text = report(trace)
    assert "GradScaler: 6 steps, 1 skipped\n  after #2 (line 16): step skipped: inf/NaN in gradients, " \
           "scale 2048 → 1024\n" in text
    assert "after #1: GradScaler.step(SGD) (line 16): scale 1024 → 2048" in text


def test_scaler_steps_round_trip_and_are_checked(loop):
    trace, _ = loop
    assert trace_from_json(trace.to_json()).grad_events == trace.grad_events
    data = json.loads(trace.to_json())
    step = next(i for i, e in enumerate(data["grad_events"]) if e["kind"] == "scaler.step")
    data["grad_events"][step]["skipped"] = 1
    with pytest.raises(TraceFormatError, match=rf"field 'grad_events': \[{step}\]: a scaler step has"):
        trace_from_json(json.dumps(data))
    data["grad_events"][step]["skipped"] = False
    del data["grad_events"][step]["scale_after"]
    with pytest.raises(TraceFormatError, match=rf"field 'grad_events': \[{step}\]: expected an event"):
        trace_from_json(json.dumps(data))


def test_a_disabled_scaler_records_no_scaler_step(tmp_path):
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent("""\
        import torch
        w = torch.ones(2, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        scaler.scale(w.sum()).backward()
        scaler.step(opt)
        scaler.update()
    """))
    trace = capture_script(str(path))
    assert [e["kind"] for e in trace.grad_events] == ["optimizer.step"]


def test_the_amp_example_skips_step_3_with_the_scales_the_scaler_had(capsys):
    runpy.run_path(str(EXAMPLE))  # the plain run prints scaler.get_scale() before and after each step
    printed = re.findall(r"step (\d)  loss (\S+)  scale (\d+) -> (\d+)", capsys.readouterr().out)
    plain = [(int(s), float(a), float(b)) for s, _, a, b in printed]
    assert plain == [(0, 65536.0, 65536.0), (1, 65536.0, 65536.0), (2, 65536.0, 65536.0), (3, 65536.0, 32768.0),
                     (4, 32768.0, 32768.0), (5, 32768.0, 32768.0)]
    assert float(printed[3][1]) == pytest.approx(18.3, abs=0.05)  # the loss itself is finite
    trace = capture_script(str(EXAMPLE))
    steps = scaler_steps(trace)
    assert [(s.call, s.line, s.scale, s.skipped, s.scale_after) for s in steps] == \
        [(i, 35, a, i == 3, b) for i, a, b in plain]
    assert [s.note for s in grad_health(trace).skipped] == ["step skipped: inf/NaN in gradients, scale 65536 → 32768"]
    call = next(c for c in trace.calls if c.index == 3)
    assert call.grad_norms["modules"] == {"2": "inf", "0": "inf"}  # the scaled gradients overflowed float16
    assert [e["after_call"] for e in trace.grad_events if e["kind"] == "optimizer.step"] == [0, 1, 2, 4, 5]


def test_unscale_then_clip_then_step_records_the_clip_and_the_skip(tmp_path):
    """The usual way to clip under a scaler: unscale_ first, so clip_grad_norm_ sees true gradients."""
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent("""\
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu")
        x = torch.randn(4, 3)
        totals = []
        for step in range(2):
            opt.zero_grad()
            scaler.scale(model(x * (1e38 if step else 1.0)).pow(2).mean()).backward()
            scaler.unscale_(opt)
            totals.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5))
            scaler.step(opt)
            scaler.update()
    """))
    trace = capture_script(str(path))
    plain = runpy.run_path(str(path))
    events = [(e["after_call"], e["kind"]) for e in trace.grad_events if e["kind"] != "zero_grad"]
    assert events == [(0, "clip_grad_norm_"), (0, "scaler.step"), (0, "optimizer.step"),
                      (1, "clip_grad_norm_"), (1, "scaler.step")]
    clips = [e for e in trace.grad_events if e["kind"] == "clip_grad_norm_"]
    assert clips[0]["total_norm"] == float(plain["totals"][0])  # unscaled: the true norm
    assert float(plain["totals"][1]) != float(plain["totals"][1]) and clips[1]["total_norm"] == "nan"
    assert [s.note for s in scaler_steps(trace)] == ["scale 65536",
                                                     "step skipped: inf/NaN in gradients, scale 65536 → 32768"]
