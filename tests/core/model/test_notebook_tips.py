"""A notebook's graph says "cell 3, line 7" where a script's says "line 14": in-place, stale and hook tips."""

import json
from functools import partial

import pytest

torch = pytest.importorskip("torch")

from core.model import anatomy  # noqa: E402
from core.model.causes import hook_tips  # noqa: E402
from core.programs.notebook import where  # noqa: E402
from core.worker.capture.recorder import capture_script  # noqa: E402

CELLS = [("code", "import torch\nw = torch.ones(3, requires_grad=True)"),
         ("markdown", "An in-place op after sigmoid"),
         ("code", "def clip(g):\n    return g.clamp(-1, 1)\n\nh = w * 2\nh.register_hook(clip)\ns = h.sigmoid()\n"
                  "s.mul_(2)"),
         ("code", "s.sum().backward()")]
HOOK_WORDS = ": registered with register_hook on h; runs on the gradient of this node's output, before the node " \
             "runs and may replace the gradient"


@pytest.fixture
def trace(tmp_path):
    cells = [{"cell_type": kind, "metadata": {}, "source": src,
              **({"outputs": [], "execution_count": None} if kind == "code" else {})} for kind, src in CELLS]
    path = tmp_path / "lesson.ipynb"
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return capture_script(str(path))


def _nodes(call):
    stale = next(n for n in call.nodes if n.stale is not None)
    inplace = next(n for n in call.nodes if n.inplace)
    hooked = next(n for n in call.nodes if hook_tips(call, n))
    return stale, inplace, hooked


def test_tips_name_the_cell_and_its_line(trace):
    assert trace.cells == [{"cell": 1, "first": 3, "lines": 2}, {"cell": 3, "first": 7, "lines": 7},
                           {"cell": 4, "first": 16, "lines": 1}]
    call = trace.calls[-1]
    stale, inplace, hooked = _nodes(call)
    assert (stale.name, stale.stale.op_line, inplace.line) == ("SigmoidBackward0", 14, 14)
    # Unnamed, the script's lines are told (the notebook run as one script).
    assert "mul_ at line 14 changed it in place" in anatomy.stale_tip(call, stale)
    assert hook_tips(call, hooked) == ["clip (line 8)" + HOOK_WORDS]

    anatomy.name_lines(trace.calls, partial(where, trace.cells))
    assert anatomy.stale_tip(call, stale) == (
        "s (saved as 'result') was saved at version 0 by SigmoidBackward0; mul_ at cell 3, line 7 changed it in "
        "place (now version 1): backward will fail here.")
    assert anatomy.inplace_tip(call, inplace) == (
        "In-place op: mul_ at cell 3, line 7 changed s in place. Its version counter went up by one and this "
        "MulBackward0 became its grad_fn, stacked on SigmoidBackward0, which made it before. SigmoidBackward0 "
        "saved the old value: backward fails there.")
    assert hook_tips(call, hooked) == ["clip (cell 3, line 1)" + HOOK_WORDS]
    assert anatomy.line_name(call, 13) == "cell 3, line 6"
    assert anatomy.line_name(call, None) == ""


def test_line_names_are_never_saved(trace):
    anatomy.name_lines(trace.calls, partial(where, trace.cells))
    assert anatomy.WHERE in trace.calls[-1].options
    assert anatomy.WHERE not in json.loads(trace.to_json())["calls"][-1]["options"]


def test_a_hook_without_a_line_is_kept_as_stored(trace):
    call = trace.calls[-1]
    assert anatomy.hook_name(call, "clip (line 8)") == "clip (line 8)"
    anatomy.name_lines(trace.calls, partial(where, trace.cells))
    assert anatomy.hook_name(call, "clip") == "clip"
    assert anatomy.hook_name(call, "<lambda> (line 8)") == "<lambda> (cell 3, line 1)"
