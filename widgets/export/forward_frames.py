"""The forward replay as numbered PNG frames and a GIF: one frame per op, in creation order.

Frame k (``frame_001.png`` …) is the graph as the replay draws it after the first k ops
(``widgets.graph.replay.FramePainter``: what is not made yet a faded ghost, the newest op
ringed), captioned "Forward, op 5 of 12: AddBackward0, line 7". Every frame has the same size: the
sheet is laid out once over the whole graph, as the backward step frames are
(``widgets.export.graph_export.export_frames``, whose view, sheet and GIF code this reuses).
"""

from __future__ import annotations

from pathlib import Path

from core.model.forward_order import forward_replay, replay_caption
from core.model.trace import CallInfo
from widgets.export.graph_export import ExportError, export_gif, make_sheet, offscreen_view, render_png, source_rect
from widgets.graph.replay import FramePainter


def frame_name(k: int, total: int) -> str:
    """``frame_001.png``: numbered from 1, at least three digits, all of one width."""
    return f"frame_{k:0{max(3, len(str(total)))}d}.png"


def export_forward_frames(call: CallInfo, directory, *, theme: str = "print", title=None, collapsed=None,
                          show_shapes=False, show_saved=False, scale: float = 1.5, progress=None) -> list[Path]:
    """One PNG per op of ``call``'s forward pass, in the order it made them; returns their paths.

    ``progress(done, total)`` is called after each frame; returning False stops early."""
    replay = forward_replay(call)
    if not len(replay):
        raise ExportError(f"call #{call.index} has no ops to replay")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with offscreen_view(call, theme=theme, collapsed=collapsed, show_shapes=show_shapes, show_saved=show_saved) as v:
        source = source_rect(v)  # the whole graph: every frame the same size
        paths, painter = [], FramePainter(v)
        for k in range(1, len(replay) + 1):
            painter.paint(replay.nodes_at(k), replay.step(k).op)
            sheet = make_sheet(v, title=title, caption=f"Forward, {replay_caption(replay, k)}", source=source)
            paths.append(render_png(v, directory / frame_name(k, len(replay)), scale=scale, sheet=sheet,
                                    background=None))
            if progress is not None and progress(k, len(replay)) is False:
                break
        return paths


def write_forward_frames(call: CallInfo, directory, gif=None, duration_ms: int = 700, **options) -> list[str]:
    """The frames of ``export_forward_frames`` in ``directory`` and, given a path, their GIF; the
    lines saying what was written (``main.py export --forward-frames DIR [--gif OUT.gif]``)."""
    paths = export_forward_frames(call, directory, **options)
    done = [f"{directory}: {len(paths)} forward frames of call #{call.index}"]
    if gif is not None:
        Path(gif).parent.mkdir(parents=True, exist_ok=True)
        export_gif(paths, gif, duration_ms)
        done.append(f"{gif}: {len(paths)} forward frames")
    return done
