"""The headless commands: trace and step, through the same worker as the app."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "resources" / "examples"


def _main(*args, timeout=180):
    return subprocess.run([sys.executable, "main.py", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_trace_writes_json_with_the_documented_keys(tmp_path):
    out = tmp_path / "out.json"
    result = _main("trace", EXAMPLES / "02_polynomial.py", "--json", out)
    assert result.returncode == 0, result.stderr
    assert "x.grad = 8" in result.stdout
    data = json.loads(out.read_text())
    assert data["format"] == "backprop-studio-trace" and data["error"] is None
    call = data["calls"][0]
    assert call["api"] == "Tensor.backward" and call["line"] == 12
    assert {n["name"] for n in call["nodes"]} == {"AddBackward0", "MulBackward0", "PowBackward0", "AccumulateGrad"}


@pytest.mark.slow
def test_trace_reports_a_failing_script(tmp_path):
    result = _main("trace", EXAMPLES / "08_inplace_error.py")
    assert result.returncode == 1
    assert "stale saved tensor: SigmoidBackward0.result saved at version 0, now 1 (modified by mul_ at line 12)" \
        in result.stdout
    assert "error at line 14: RuntimeError" in result.stdout


@pytest.mark.slow
def test_step_writes_every_node_in_engine_order(tmp_path):
    torch = pytest.importorskip("torch")
    out = tmp_path / "steps.json"
    result = _main("step", EXAMPLES / "13_mlp_classifier.py", "--call", 0, "--json", out)
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    names = [s["name"] for s in doc["steps"]]
    assert names[0] == "NllLossBackward0"
    assert sorted(names) == sorted(["AccumulateGrad"] * 4 + ["AddmmBackward0"] * 2 + ["TBackward0"] * 2 + [
        "LogSoftmaxBackward0", "NllLossBackward0", "ReluBackward0"])
    for step in doc["steps"]:
        assert set(step) >= {"node", "name", "grad_outputs", "grad_inputs"}
    # The stepped call's leaf grads equal a fresh call's (the script is seeded).
    fresh = _main("trace", EXAMPLES / "13_mlp_classifier.py", "--json", tmp_path / "t.json")
    assert fresh.returncode == 0
    first = json.loads((tmp_path / "t.json").read_text())["calls"][0]["leaf_grads"]
    for name, values in first.items():
        got = doc["leaf_grads"][name]
        want = values["data"] if values.get("data") is not None else values["sample"]
        have = got["data"] if got.get("data") is not None else got["sample"]
        assert torch.allclose(torch.tensor(have), torch.tensor(want), atol=1e-6)


@pytest.mark.slow
def test_step_stops_at_the_failing_node(tmp_path):
    result = _main("step", EXAMPLES / "09_backward_twice.py", "--call", 1)
    assert result.returncode == 1
    assert "MulBackward0" in result.stdout and "FAILED: RuntimeError" in result.stdout
    assert "Trying to backward through the graph a second time" in result.stdout


def test_help_lists_every_command_with_one_line(capsys, monkeypatch):
    from app.main import main

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    commands = out.split("commands:\n")[1].split("\n\n")[0]
    assert commands.splitlines() == [
        "  open        open SCRIPT in the window and run it (the default command)",
        "  view        open a saved trace (TRACE.json) in the window, running nothing",
        "  trace       run a script and summarise every autograd graph it builds",
        "  step        step through one backward call node by node, printing each step",
        "  export      export graphs (PNG, SVG, PDF, DOT, JSON) or the memory chart",
        "  hosts       list, add, remove or check the hosts workers can run on",
    ]
    assert "'backprop-studio SCRIPT [options]' is 'backprop-studio open SCRIPT [options]'" in out


@pytest.mark.slow
def test_step_by_breakpoint_writes_the_same_runs_call(tmp_path):
    script = tmp_path / "unseeded.py"
    script.write_text("import torch\n"
                      "w = torch.randn(3, requires_grad=True)\n"
                      "for i in range(3):\n"
                      "    loss = (w * w * (i + 1)).sum()\n"
                      "    loss.backward()\n"
                      "(w * 5).sum().backward()\n")
    out = tmp_path / "steps.json"
    result = _main("step", script, "--breakpoint", 6, "--json", out)
    assert result.returncode == 0, result.stderr
    doc = json.loads(out.read_text())
    assert (doc["index"], doc["line"], doc["api"], doc["state"]) == (3, 6, "Tensor.backward", "finished")
    call = doc["call"]
    assert [n["name"] for n in call["nodes"]] == ["SumBackward0", "MulBackward0", "AccumulateGrad"]
    w = next(t for t in call["tensors"] if t["name"] == "w")
    # w.grad after the call: 2w(1+2+3) + 5, from the values w held in this very run.
    # float32 sums four terms near 5, so allow a few units in the last place of 5, not of the result.
    want = [12 * v + 5 for v in w["values"]["data"]]
    got = doc["leaf_grads"]["w"]["data"]
    assert got == pytest.approx(want, rel=1e-6, abs=4e-6)
    assert doc["steps"][-1]["leaf_grads"]["w"]["data"] == got
    assert set(doc["seeds"]) >= {"torch", "random"}
