"""``main.py export SCRIPT --forward-frames DIR [--gif OUT.gif]``: one PNG per op of the first call, in
the order the forward pass made them (torch's sequence numbers), and their GIF."""

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image
from PySide6.QtGui import QImage

from core.model.trace_json import load_trace
from widgets.export.graph_export import make_sheet, offscreen_view, render_png, source_rect
from widgets.graph.replay import paint_frame

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = """\
import torch
a = torch.tensor([1., 2.], requires_grad=True)
w = torch.tensor([3., 4.], requires_grad=True)
b = a * 2
c = w.exp()
d = (b + c).sum()
d.backward()
"""


def _main(*args, timeout=240):
    return subprocess.run([sys.executable, "main.py", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def _frame_by_seqs(call, k, path):
    """Frame k drawn from the trace's own numbers: the k ops with the smallest seq, and the leaves they use."""
    ops = sorted((n for n in call.nodes if n.seq is not None), key=lambda n: n.seq)
    shown = set()
    for n in ops[:k]:
        shown |= {n.id} | {e.node for e in n.next if e is not None and call.node(e.node).kind == "accumulate_grad"}
    newest = ops[k - 1]
    with offscreen_view(call) as v:
        source = source_rect(v)
        paint_frame(v, frozenset(shown), newest.id)
        caption = f"Forward, op {k} of {len(ops)}: {newest.name}, line {newest.line}"
        render_png(v, path, scale=1.5, sheet=make_sheet(v, caption=caption, source=source), background=None)
    return QImage(str(path))


@pytest.mark.slow
def test_forward_frames_are_the_ops_in_creation_order_and_the_gif_holds_them(qapp, tmp_path):
    script = tmp_path / "branches.py"
    script.write_text(SCRIPT)
    frames, gif, out = tmp_path / "frames", tmp_path / "forward.gif", tmp_path / "trace.json"
    r = _main("export", script, "-o", out, "--forward-frames", frames, "--gif", gif)
    assert r.returncode == 0, r.stderr
    assert f"{frames}: 4 forward frames of call #0" in r.stdout and f"{gif}: 4 forward frames" in r.stdout

    call = load_trace(out).calls[0]
    by_seq = [n.name for n in sorted((n for n in call.nodes if n.seq is not None), key=lambda n: n.seq)]
    assert by_seq == ["MulBackward0", "ExpBackward0", "AddBackward0", "SumBackward0"]
    assert sorted(p.name for p in frames.iterdir()) == ["frame_001.png", "frame_002.png", "frame_003.png",
                                                         "frame_004.png"]
    images = [QImage(str(frames / f"frame_{k:03d}.png")) for k in range(1, 5)]
    assert len({(i.width(), i.height()) for i in images}) == 1  # one size: the GIF does not jump
    for k, image in enumerate(images, start=1):
        assert image == _frame_by_seqs(call, k, tmp_path / f"expected_{k}.png"), f"frame {k}"
    assert images[0] != images[1]
    with Image.open(gif) as g:
        assert g.n_frames == 4 and g.size == (images[0].width(), images[0].height())


@pytest.mark.slow
def test_forward_frames_without_gif_run_no_backward_stepping(tmp_path):
    script = tmp_path / "branches.py"
    script.write_text(SCRIPT)
    frames = tmp_path / "frames"
    r = _main("export", script, "-o", tmp_path / "graph.png", "--forward-frames", frames)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in frames.iterdir()) == [f"frame_00{k}.png" for k in range(1, 5)]
    assert (tmp_path / "graph.png").is_file() and not list(tmp_path.glob("*.gif"))
