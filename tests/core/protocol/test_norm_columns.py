"""Gradient norms in the columnar encoding: names and float bits, what the reader can compute left out.

Every round trip is exact (the same JSON, in the same order); what does not pack travels as JSON;
packed norms that are wrong are named by their field.
"""

from __future__ import annotations

import json
import random
import struct
import zlib
from dataclasses import replace

import pytest

from core.model.grad_health import as_norm, module_norms, norm_ratio
from core.model.trace import TraceFormatError
from core.protocol import column_reader as tr
from core.protocol import columns as tc
from core.protocol.norm_pack import pack_grad_norms
from tests.core.protocol.column_data import column_items, joined
from tests.fixtures_graphs import residual_mlp_call


def f32(x: float) -> float:
    """``x`` rounded to float32, as the worker's norms of float32 gradients are."""
    return struct.unpack("f", struct.pack("f", x))[0]


def recorded_norms(blocks: int, seed: int = 0, bad: dict | None = None) -> dict:
    """Norms as the worker records them (core.worker.capture.grad_norms): float32 norms per parameter,
    ratios and module norms computed from them. ``bad``: names whose ‖grad‖ is "nan" or "inf"."""
    rng = random.Random(seed)
    names = [f"layers.{i}.fc.{kind}" for i in reversed(range(blocks)) for kind in ("bias", "weight")]
    grads = [float(bad[n] if bad and n in bad else f32(rng.uniform(1e-4, 3.0))) for n in names]
    params = [0.0 if n.endswith("bias") and i % 3 == 0 else f32(rng.uniform(0.5, 20.0))  # biases at zero
              for i, n in enumerate(names)]
    out = {}
    for i, name in enumerate(names):
        out[name] = {"module": name.rsplit(".", 1)[0], "grad": as_norm(grads[i]), "param": params[i],
                     "ratio": norm_ratio(grads[i], params[i])}
        if i % 7 == 0:
            out[name]["added"] = f32(rng.uniform(0.0, 1.0))
    return {"params": out, "modules": {m: as_norm(n) for m, n in module_norms(names, grads).items()}}


def _with_norms(norms) -> tuple:
    call = replace(residual_mlp_call(blocks=4), grad_norms=norms)
    data = tc.encode(call)
    (item,) = [i for i in column_items(data) if i[0] == "grad_norms"]
    return call, data, item


def test_recorded_norms_pack_to_names_and_floats_and_come_back_exactly():
    norms = recorded_norms(50, bad={"layers.3.fc.weight": float("nan"), "layers.9.fc.bias": float("inf")})
    call, data, (path, kind, payload) = _with_norms(norms)
    assert kind == "norms"
    (packed,) = payload
    # the ratios and module norms are what the reader computes from the rest: not sent
    assert sorted(packed) == ["added", "grad", "names", "param"]
    assert packed["names"] == list(norms["params"])
    back = tr.decode(data, "call")
    assert json.dumps(back.grad_norms) == json.dumps(norms)  # equal, in the same order, "nan" and "inf" kept
    assert back.grad_norms["params"]["layers.3.fc.weight"]["ratio"] == "nan"
    assert back.grad_norms["modules"]["layers.9.fc"] == "inf"
    assert "added" not in back.grad_norms["params"]["layers.49.fc.weight"]  # i = 1: none added
    zero = back.grad_norms["params"]["layers.49.fc.bias"]  # a bias at zero: ‖param‖ 0, no ratio
    assert (zero["param"], zero["ratio"]) == (0.0, None)


def test_norms_that_differ_from_what_the_reader_computes_travel_with_them():
    norms = recorded_norms(10)
    norms["params"]["layers.2.fc.bias"]["ratio"] = 0.5
    norms["modules"]["layers.4.fc"] = 123.25
    _call, data, (_, kind, (packed,)) = _with_norms(norms)
    assert kind == "norms" and {"ratio", "modules"} <= packed.keys()
    assert json.dumps(tr.decode(data, "call").grad_norms) == json.dumps(norms)


@pytest.mark.parametrize("change", ["an integer norm", "a key of its own", "a module path of its own"])
def test_norms_that_do_not_pack_exactly_travel_as_json(change):
    norms = recorded_norms(3)
    entry = norms["params"]["layers.1.fc.weight"]
    if change == "an integer norm":
        entry["grad"] = 3
    elif change == "a key of its own":
        entry["note"] = "x"
    else:
        entry["module"] = "layers.1"
    assert pack_grad_norms(norms) is None
    _call, data, (_, kind, payload) = _with_norms(norms)
    assert kind == "vals" and payload == [norms]
    if change == "an integer norm":  # the reader's check of the dict is the JSON one
        assert json.dumps(tr.decode(data, "call").grad_norms) == json.dumps(norms)


@pytest.mark.parametrize("edit, message", [
    (lambda p: p.update(names=p["names"][:1] * len(p["names"])), "'names': expected distinct parameter names"),
    (lambda p: p.update(grad=[p["grad"][0][:-4], p["grad"][1]]), "'grad': expected 6 presence flags"),
    (lambda p: p.update(param=[p["param"][0], p["param"][1][:8]]),
     "'param': the packed floats do not match their flags"),
    (lambda p: p.pop("added"), "expected packed norms with 'names', 'grad', 'param', 'added'"),
    (lambda p: p.update(modules=[["a", "a"], "AQE=", ""]), r"'modules': expected \[distinct paths"),
])
def test_packed_norms_that_are_wrong_are_named(edit, message):
    _call, data, _item = _with_norms(recorded_norms(3))
    items = column_items(data)
    (item,) = [i for i in items if i[0] == "grad_norms"]
    edit(item[2][0])
    with pytest.raises(TraceFormatError, match=rf"field 'grad_norms': {message}"):
        tr.decode(joined(items), "call")


def test_a_loops_norms_cost_under_a_third_of_their_json_on_the_wire():
    norms = recorded_norms(800)  # 1,600 parameters, as the 4,802-node example's
    json_bytes = len(zlib.compress(json.dumps(norms).encode(), 6))
    _call, data, item = _with_norms(norms)
    packed_bytes = len(zlib.compress(json.dumps(item).encode(), 6))
    assert packed_bytes * 3 < json_bytes, (packed_bytes, json_bytes)  # 18,941 against 71,342 bytes


def test_a_real_training_loops_norms_round_trip():
    pytest.importorskip("torch")
    from pathlib import Path

    from core.worker.capture.recorder import capture_script

    trace = capture_script(str(Path(__file__).parents[3] / "resources/examples/35_exploding_and_clipping.py"))
    calls = [c for c in trace.calls if c.grad_norms]
    assert len(calls) == 16
    for call in calls:
        packed = pack_grad_norms(call.grad_norms)
        assert packed is not None and "ratio" not in packed and "modules" not in packed, call.index
        back = tr.decode(tc.encode(call), "call")
        assert json.dumps(back.grad_norms) == json.dumps(call.grad_norms), call.index
