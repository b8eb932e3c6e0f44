"""The trace format: required keys, JSON round trip, clear errors on bad input."""

import json

import pytest

from core.model.trace import FORMAT, VERSION, TraceFormatError
from core.model.trace_json import load_trace, trace_from_dict, trace_from_json

pytest.importorskip("torch")

from core.worker.capture.recorder import capture_script  # noqa: E402


@pytest.fixture(scope="module")
def mul_trace(tmp_path_factory):
    script = tmp_path_factory.mktemp("s") / "mul.py"
    script.write_text(
        "import torch\n"
        "a = torch.tensor(2.0, requires_grad=True)\n"
        "b = torch.tensor(3.0, requires_grad=True)\n"
        "c = a * b\n"
        "c.backward()\n"
    )
    return capture_script(str(script))


def test_required_keys(mul_trace):
    data = json.loads(mul_trace.to_json())
    assert data["format"] == FORMAT and data["version"] == VERSION
    assert data["error"] is None
    call = data["calls"][0]
    for key in ("api", "line", "error", "roots", "nodes", "tensors"):
        assert key in call
    assert call["api"] == "Tensor.backward" and call["line"] == 5
    node = call["nodes"][0]
    for key in ("id", "name", "kind", "next", "saved", "variable"):
        assert key in node
    assert node["name"] == "MulBackward0"
    assert node["next"] == [{"node": "n1", "input_nr": 0}, {"node": "n2", "input_nr": 0}]
    tensor = call["tensors"][0]
    for key in ("id", "name", "shape", "dtype", "device", "requires_grad", "is_leaf", "retains_grad",
                "stride", "storage_offset", "storage", "version", "values", "grad"):
        assert key in tensor
    assert tensor["values"]["data"] == [6.0] and tensor["values"]["numel"] == 1


def test_round_trip_is_identical(mul_trace, tmp_path):
    path = tmp_path / "t.json"
    mul_trace.save(path)
    again = load_trace(path)
    assert again == mul_trace
    assert again.to_dict() == mul_trace.to_dict()


def test_truncated_trace(mul_trace):
    text = mul_trace.to_json()
    with pytest.raises(TraceFormatError, match="truncated"):
        trace_from_json(text[: len(text) // 2], "half.json")


def test_newer_version(mul_trace):
    data = mul_trace.to_dict()
    data["version"] = VERSION + 1
    with pytest.raises(TraceFormatError, match="newer"):
        trace_from_dict(data)


def test_wrong_format_and_missing_field(mul_trace):
    with pytest.raises(TraceFormatError, match="format"):
        trace_from_dict({"format": "other", "version": 1, "calls": []})
    data = mul_trace.to_dict()
    del data["calls"][0]["nodes"][0]["name"]
    with pytest.raises(TraceFormatError, match=r"calls\[0\]\.nodes\[0\]\.name"):
        trace_from_dict(data)
    data = mul_trace.to_dict()
    data["calls"][0]["nodes"][0]["next"][0]["node"] = "n99"
    with pytest.raises(TraceFormatError, match="n99"):
        trace_from_dict(data)
    with pytest.raises(TraceFormatError, match="list"):
        trace_from_dict({"format": FORMAT, "version": 1, "calls": {}})


def test_unreadable_file(tmp_path):
    with pytest.raises(TraceFormatError, match="cannot read"):
        load_trace(tmp_path / "missing.json")
