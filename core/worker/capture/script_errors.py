"""The script's errors as the app shows them: its own line and a traceback without the app's frames."""

from __future__ import annotations

import traceback
from pathlib import Path

import torch

from core.worker.capture.creation import safe_str
from core.worker.capture.names import OP_FRAME, NameTable
from core.model.trace import ErrorInfo

# The app's own code (the worker, its capture, stepping and debugging, the openers of model files):
# its frames are not the script's and are left out of the tracebacks shown. Found from this file, so a
# worker sent to a host finds its own copy.
APP_CODE = Path(__file__).resolve().parents[2]
# torch's hop into a TorchFunctionMode: the capture's mode re-enters the function it intercepted.
_MODE_HOP = ("torch/overrides.py", "handle_torch_function")


def is_app_frame(filename: str) -> bool:
    """A frame of the app's own code (``core/...``), or one of the capture's generated op frames."""
    try:
        return Path(filename).resolve().is_relative_to(APP_CODE)
    except (OSError, ValueError):
        return False


def script_line(exc: BaseException, names: NameTable) -> int | None:
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if names.is_user_file(frame.f_code.co_filename) and frame.f_code.co_filename == names.script_path:
            line = lineno
    return line


def format_tb(exc: BaseException, names: NameTable) -> str:
    """The traceback from the script's first frame on, without the app's own frames: what the
    script alone would print (its frames, torch's, its libraries')."""
    tb = exc.__traceback__
    while tb is not None and not names.is_user_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    shown = traceback.TracebackException(type(exc), exc, tb, compact=True)
    seen: set[int] = set()
    pending = [shown]
    while pending:  # the exception and the ones it was raised from or during (explicit stack, no recursion)
        te = pending.pop()
        if id(te) in seen:
            continue
        seen.add(id(te))
        te.stack = traceback.StackSummary.from_list(_script_frames(te.stack))
        pending.extend(t for t in (te.__cause__, te.__context__, *(getattr(te, "exceptions", None) or ()))
                       if t is not None)
    return "".join(shown.format())


def _script_frames(stack: traceback.StackSummary) -> list[traceback.FrameSummary]:
    """``stack`` without the app's frames, nor torch's hop into the capture's function mode (the
    frame that called ``handle_torch_function`` and that call, when the mode it ran was the app's)."""
    frames = list(stack)
    kept: list[traceback.FrameSummary] = []
    for i, frame in enumerate(frames):
        if frame.name == OP_FRAME or is_app_frame(frame.filename):
            continue
        if _is_mode_hop(frame) and i + 1 < len(frames) and is_app_frame(frames[i + 1].filename):
            if kept and kept[-1].filename == frames[i - 1].filename and not _is_mode_hop(kept[-1]):
                kept.pop()  # the intercepted function's first entry: it runs again below the mode
            continue
        kept.append(frame)
    return kept


def _is_mode_hop(frame: traceback.FrameSummary) -> bool:
    return frame.name == _MODE_HOP[1] and frame.filename.replace("\\", "/").endswith(_MODE_HOP[0])


def error_info(exc: BaseException, line: int | None, names: NameTable) -> ErrorInfo:
    message = safe_str(exc)
    kind = "syntax" if isinstance(exc, SyntaxError) else "exception"
    if isinstance(exc, torch.OutOfMemoryError) or "CUDA error" in message or "CUDA out of memory" in message:
        kind = "device"
    try:
        tb = format_tb(exc, names)
    except Exception as err:  # an exception of the script's that even the traceback module cannot format
        tb = f"{type(exc).__name__}: {message}\n(its traceback could not be formatted: {type(err).__name__})\n"
    return ErrorInfo(
        type=type(exc).__name__,
        message=message,
        line=script_line(exc, names) or line,
        traceback=tb,
        kind=kind,
        file=names.script_path,
    )
