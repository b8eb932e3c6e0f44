"""The NaN/Inf check: the first non-finite forward op and backward node, exactly where the script made
them; nothing of it runs when it is off; its record through JSON, columns and the trace command."""

import json
import textwrap
import types
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from core.model.nan_check import backward_text, forward_text, summary_lines  # noqa: E402
from core.model.trace import TraceFormatError  # noqa: E402
from core.model.trace_json import trace_from_json  # noqa: E402
from core.protocol.column_reader import decode  # noqa: E402
from core.protocol.columns import encode  # noqa: E402
from core.worker.capture import nan_check  # noqa: E402
from core.worker.capture.names import OP_FRAME  # noqa: E402
from core.worker.capture.recorder import Capture  # noqa: E402

LOG_IN_MODULE = """\
import torch
import torch.nn as nn


class Act(nn.Module):
    def forward(self, h):
        return torch.log(h)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = Act()

    def forward(self, x):
        return self.act(x).sum()


model = Net()
x = torch.tensor([0.0, 1.0, 2.0, 3.0], requires_grad=True)
loss = model(x)
loss.backward()
"""

SQRT_AT_ZERO = """\
import torch

x = torch.tensor([0.0, 1.0, 4.0], requires_grad=True)
y = x.sqrt()
loss = (y * 2).sum()
loss.backward()
"""


def _run(tmp_path, source: str, check: bool = True):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    capture = Capture(str(script))
    if check:
        capture.nan_check = nan_check.NanCheck()
    return capture.run()


def test_log_of_zero_in_a_module_is_the_first_non_finite_op_and_node(tmp_path):
    trace = _run(tmp_path, LOG_IN_MODULE)
    assert trace.error is None
    call = trace.calls[0]
    assert [(n.id, n.name, n.line, n.module) for n in call.nodes] == [
        ("n0", "SumBackward0", 16, None), ("n1", "LogBackward0", 7, "act"), ("n2", "AccumulateGrad", None, None)]
    assert trace.nan_check == {
        "forward": {"op": "log", "text": "torch.log(h)", "line": 7, "module": "act", "output": 0, "shape": [4],
                    "numel": 4, "nan": 0, "posinf": 0, "neginf": 1,
                    "inputs": [{"position": 0, "name": "h", "shape": [4], "dtype": "float32", "min": 0.0,
                                "max": 3.0}],
                    "call": "c0", "node": "n1"},
        "backward": {"call": "c0", "node": "n1", "name": "LogBackward0", "line": 7, "module": "act", "input": 0,
                     "to": "n2", "shape": [4], "numel": 4, "nan": 0, "posinf": 1, "neginf": 0},
    }
    assert summary_lines(trace.nan_check) == [
        "first non-finite value: log at line 7 in act (torch.log(h)): 1 of 4 values -inf; input h in [0, 3]",
        "first non-finite gradient: LogBackward0 (line 7, call #0, node n1) in act: its gradient for input 0 "
        "has 1 of 4 values inf",
    ]


def test_sqrt_at_zero_is_finite_forward_and_infinite_in_its_backward_node(tmp_path):
    trace = _run(tmp_path, SQRT_AT_ZERO)
    call = trace.calls[0]
    assert [(n.id, n.name) for n in call.nodes] == [
        ("n0", "SumBackward0"), ("n1", "MulBackward0"), ("n2", "SqrtBackward0"), ("n3", "AccumulateGrad")]
    assert trace.nan_check == {
        "forward": None,
        "backward": {"call": "c0", "node": "n2", "name": "SqrtBackward0", "line": 4, "module": None, "input": 0,
                     "to": "n3", "shape": [3], "numel": 3, "nan": 0, "posinf": 1, "neginf": 0},
    }
    assert call.leaf_grads["x"].data == ["inf", 1.0, 0.5]


def test_the_first_of_several_non_finite_ops_is_named_with_every_input(tmp_path):
    trace = _run(tmp_path, """\
        import torch

        a = torch.tensor([1.0, 0.0, 2.0], requires_grad=True)
        b = torch.tensor([2.0, 0.0, 0.0])
        ok = a * 2
        bad = a / b
        worse = torch.log(bad)
        worse.nansum().backward()
    """)
    forward = trace.nan_check["forward"]
    assert {k: forward[k] for k in ("op", "text", "line", "module", "nan", "posinf", "neginf")} == {
        "op": "div", "text": "a.div(b)", "line": 6, "module": None, "nan": 1, "posinf": 1, "neginf": 0}
    assert forward["inputs"] == [
        {"position": 0, "name": "a", "shape": [3], "dtype": "float32", "min": 0.0, "max": 2.0},
        {"position": 1, "name": "b", "shape": [3], "dtype": "float32", "min": 0.0, "max": 2.0}]
    assert trace.calls[0].node(forward["node"]).name == "DivBackward0"
    assert forward_text(forward) == ("div at line 6 (a.div(b)): 1 nan and 1 inf of 3 values; "
                                     "input a in [0, 2], input b in [0, 2]")


def test_in_a_loop_the_call_where_it_first_happens_is_named(tmp_path):
    trace = _run(tmp_path, """\
        import torch

        w = torch.tensor([3.0, 2.0], requires_grad=True)
        for step in range(4):
            loss = torch.log(w - step).sum()
            loss.backward()
    """)
    assert trace.call_count == 4
    forward, backward = trace.nan_check["forward"], trace.nan_check["backward"]
    assert (forward["op"], forward["line"], forward["call"], forward["neginf"]) == ("log", 5, "c2", 1)
    assert forward["inputs"][0]["min"] == 0.0 and forward["inputs"][0]["max"] == 1.0
    assert (backward["name"], backward["call"], backward["line"], backward["posinf"]) == ("LogBackward0", "c2", 5, 1)
    assert backward_text(backward).startswith("LogBackward0 (line 5, call #2, node ")


def test_off_no_mode_is_pushed_no_node_is_hooked_and_the_field_is_absent(tmp_path, monkeypatch):
    made = []
    real = nan_check._node_hook
    monkeypatch.setattr(nan_check, "_node_hook", lambda *a: made.append(a[2]) or real(*a))
    off = _run(tmp_path, SQRT_AT_ZERO, check=False)
    assert off.nan_check is None
    assert "nan_check" not in json.loads(off.to_json())
    assert made == []
    on = _run(tmp_path, SQRT_AT_ZERO)
    assert made == ["n0", "n1", "n2"]  # every node that computes a gradient; the leaf's AccumulateGrad does not
    assert on.nan_check["backward"]["node"] == "n2"
    assert _modes_seen(tmp_path, check=False) == ["_CreationMode"]
    assert _modes_seen(tmp_path, check=True) == ["_NanMode", "_CreationMode"]


def _modes_seen(tmp_path, check: bool) -> list:
    script = tmp_path / "modes.py"
    script.write_text("import torch\nMODES = [type(m).__name__ for m in "
                      "torch.overrides._get_current_function_mode_stack()]\n")
    capture = Capture(str(script))
    if check:
        capture.nan_check = nan_check.NanCheck()
    capture.run()
    return capture.namespace["MODES"]


def test_the_record_survives_json_and_columns_and_bad_records_are_named(tmp_path):
    trace = _run(tmp_path, LOG_IN_MODULE)
    back = trace_from_json(trace.to_json(), "t.json")
    assert back.nan_check == trace.nan_check
    assert decode(encode(trace)).nan_check == trace.nan_check
    data = json.loads(trace.to_json())
    del data["nan_check"]
    assert trace_from_json(json.dumps(data), "old.json").nan_check is None  # files written before the field
    bad = json.loads(trace.to_json())
    bad["nan_check"]["backward"]["extra"] = 1
    with pytest.raises(TraceFormatError, match=r"^t.json: field 'nan_check': 'backward': 'extra' is not a key of "
                                               r"a backward node's record$"):
        trace_from_json(json.dumps(bad), "t.json")
    bad = json.loads(trace.to_json())
    del bad["nan_check"]["forward"]["inputs"][0]["min"]
    with pytest.raises(TraceFormatError, match=r"'forward.inputs\[0\]': 'min' missing$"):
        trace_from_json(json.dumps(bad), "t.json")
    elsewhere = replace(trace, nan_check={**trace.nan_check, "backward": {**trace.nan_check["backward"],
                                                                          "node": "n9"}})
    with pytest.raises(TraceFormatError, match=r"^t.json: field 'nan_check.backward.node': names node 'n9', which "
                                               r"call 'c0' does not have$"):
        trace_from_json(elsewhere.to_json(), "t.json")


@pytest.mark.slow
def test_the_trace_command_prints_both_and_writes_them_in_the_json(tmp_path, capsys):
    from app.cli.commands import main as cli_main
    from core.model.trace_json import load_trace

    script = tmp_path / "script.py"
    script.write_text(SQRT_AT_ZERO)
    out = tmp_path / "t.json"
    assert cli_main(["trace", str(script), "--nan-check", "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "first non-finite value: none (every op's output was finite)" in lines
    assert ("first non-finite gradient: SqrtBackward0 (line 4, call #0, node n2): its gradient for input 0 has "
            "1 of 3 values inf") in lines
    assert load_trace(out).nan_check["backward"]["name"] == "SqrtBackward0"
    assert cli_main(["trace", str(script), "--json", str(out)]) == 0
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("first non-finite")]
    assert "nan_check" not in json.loads(out.read_text())


def test_the_bundled_example_names_its_log_and_the_node_it_made():
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "resources" / "examples" / "33_first_nan.py"
    capture = Capture(str(example))
    capture.nan_check = nan_check.NanCheck()
    trace = capture.run()
    forward, backward = trace.nan_check["forward"], trace.nan_check["backward"]
    assert (forward["op"], forward["text"], forward["line"], forward["neginf"], forward["call"]) == (
        "log", "torch.log(q)", 25, 1, "c0")
    assert forward["inputs"][0]["name"] == "q" and forward["inputs"][0]["min"] == 0.0
    assert abs(forward["inputs"][0]["max"] - 0.924142) < 1e-6
    assert trace.calls[0].node(forward["node"]).name == "LogBackward0"
    assert (backward["name"], backward["node"], backward["line"], backward["nan"], backward["call"]) == (
        "LogBackward0", forward["node"], 25, 1, "c0")


def test_memory_not_yet_written_is_not_a_finding():
    """``torch.empty`` hands back whatever the allocator left there, NaN included: only what the
    script then writes counts."""

    class _Names:
        module_paths: dict = {}

        def refresh(self, frames):
            pass

        def release(self):
            pass

        def user_frames(self, frame):
            return []

        def user_line(self, frame):
            return 3

        def name_of(self, t):
            return None

    class _Capture:
        tagging = True
        names = _Names()

    def empty(*shape):
        return torch.full(shape, float("nan"))

    def fill_(t, value):
        return t.fill_(value)

    check = nan_check.NanCheck()
    check.capture = _Capture()
    mode = nan_check._NanMode(check)
    # The capture's mode calls the script's ops from a frame named OP_FRAME: so does this one.
    code = compile("def _(m, f, a): return m.__torch_function__(f, (), a)", "<test>", "exec").co_consts[0]
    through_op = types.FunctionType(code.replace(co_name=OP_FRAME), {})
    garbage = through_op(mode, empty, (2,))
    assert check.forward is None
    assert mode.__torch_function__(fill_, (), (garbage, float("inf"))) is garbage
    assert check.forward is None  # not the script's op: one the capture ran itself
    through_op(mode, fill_, (garbage, float("inf")))
    assert (check.forward["op"], check.forward["line"], check.forward["posinf"]) == ("fill_", 3, 2)


def test_warnings_and_errors_name_the_script_line_with_the_check_on(tmp_path):
    source = """\
        import warnings
        import torch
        import torch.nn.functional as F

        x = torch.ones(2, 3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            y = F.softmax(x)
        WHERE = [(w.filename.rsplit("/", 1)[-1], w.lineno) for w in caught]
        z = F.softmax(x, dim=5)
    """
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    seen = []
    for check in (False, True):
        capture = Capture(str(script))
        if check:
            capture.nan_check = nan_check.NanCheck()
        trace = capture.run()
        seen.append((capture.namespace["WHERE"], trace.error.line, trace.error.traceback))
    assert seen[0] == seen[1]  # the warning's place (torch's softmax line, as without the capture's mode too)
    assert len(seen[1][0]) == 1 and seen[1][0][0][0] != "nan_check.py" and seen[1][1] == 10


def test_a_torch_function_written_in_python_is_found_at_the_script_line(tmp_path):
    # torch.norm reaches the modes through handle_torch_function: one more frame between op and script.
    trace = _run(tmp_path, """\
        import torch

        x = torch.tensor([1e30, 1e30])
        n = torch.norm(x)
    """)
    forward = trace.nan_check["forward"]
    assert (forward["op"], forward["line"], forward["posinf"]) == ("norm", 4, 1)
    assert forward["inputs"][0]["min"] == torch.tensor(1e30).item()  # 1e30 as float32 holds it
