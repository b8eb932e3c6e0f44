"""Show a tensor's autograd graph in Backprop Studio, from a notebook or a script.

    from backprop_studio import show
    loss = model(x).pow(2).mean()
    show(loss)

The graph is captured here, in the caller's process, with the same capture code a traced
run uses (backward is not run: the notebook keeps its graph), saved as a trace file and
sent to a running Backprop Studio window, or a new window opens on it; inside
``with record():`` each op also remembers its line. The window is titled by the caller's file,
line and call ("train.py:42 — show(loss)"). No Qt is imported here. Inside a script that
Backprop Studio itself is running, ``show()`` does nothing: the run already captures every graph.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import torch

from core.client.show_link import caller_title, send_open, write_private
from core.worker.capture.show_cuts import note_saved_cuts
from core.worker.capture.tensor_capture import LineTags, capture_tensor

__all__ = ["record", "show"]

ROOT = Path(__file__).resolve().parent


def show(tensor, *, save: str | os.PathLike | None = None, open_window: bool = True) -> str | None:
    """Capture the graph that produced ``tensor`` and show it in Backprop Studio.

    ``save``: where to write the trace (JSON, the format of ``trace --json``); a temporary
    file only the user can read by default. ``open_window=False`` only writes it. Returns the trace's path, or None
    inside a Backprop Studio run.
    """
    if os.environ.get("BACKPROP_STUDIO_WORKER"):
        return None
    caller = sys._getframe(1)
    if isinstance(tensor, torch.Tensor):
        note_saved_cuts(tensor, caller)  # cut inputs named as a traced run names them
    trace = capture_tensor(tensor, caller)
    title = caller_title(caller)  # the window's title: "train.py:42 — show(loss)"
    if save is None:  # a private file: a shared temp folder must not let others read or replace it
        path = write_private(trace.to_json())
    else:
        path = str(Path(save).resolve())
        trace.save(path)
    if open_window:
        if not send_open(path, title=title):
            _start_window(path, title)
    return path


@contextlib.contextmanager
def record():
    """Within this block, each op remembers the caller's line that created it, so ``show()``
    links nodes to lines (``with record(): loss = model(x).sum()``)."""
    if os.environ.get("BACKPROP_STUDIO_WORKER"):
        yield
        return
    with LineTags(sys._getframe(2).f_code.co_filename):
        yield


def _start_window(path: str, title: str) -> None:
    """A new Backprop Studio window on ``path``, titled ``title``, detached from the caller (a
    kernel keeps running)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    kwargs = {"start_new_session": True} if os.name == "posix" else {}
    subprocess.Popen([sys.executable, "-c", "import sys; from app.main import main; sys.exit(main())",
                      "--title", title, path],
                     env=env, cwd=str(ROOT), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, **kwargs)
