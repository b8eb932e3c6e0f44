"""The script's errors as the app shows them: its own line, a traceback without the app's frames,
and, for an error raised inside a torch op, that op and the tensors it was called on."""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from core.worker.capture.creation import _CreationMode, safe_str
from core.worker.capture.names import OP_FRAME, NameTable
from core.worker.capture.node_graph import shape_of
from core.worker.capture.snapshot import dtype_name
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


# -- the op that raised ------------------------------------------------------------------------
# Every torch op the script calls runs through the capture's TorchFunctionMode, so an error raised
# by an op passes through its ``__torch_function__`` frame, whose locals still hold the function,
# its arguments and the frame that called it while the traceback lives.
_MODE_CODE = _CreationMode.__torch_function__.__code__
ARG_CHARS = 32  # one argument in an op's text
TEXT_CHARS = 90  # the whole text


@dataclass
class FailedOp:
    """The torch op an exception of the script came from, with live references (worker side only):
    kept from the ``except`` until the graph it failed on is captured, then dropped."""

    func: Any
    args: tuple
    kwargs: dict
    line: int | None
    frames: list[FrameType] = field(default_factory=list)  # the script's frames at the op, innermost first

    @property
    def name(self) -> str:
        return str(getattr(self.func, "__name__", "") or type(self.func).__name__)

    def tensors(self) -> list[tuple[int, torch.Tensor]]:
        """(position, tensor) of each tensor it was called on, those in a list argument included."""
        out = []
        for i, a in enumerate(self.args):
            if isinstance(a, torch.Tensor):
                out.append((i, a))
            elif isinstance(a, (list, tuple)):
                out.extend((i, t) for t in a if isinstance(t, torch.Tensor))
        return out

    def text(self, name_of) -> str:
        """The call as the op saw it, tensors by the script's names: ``x.add_(1)``, ``torch.mm(x, w)``."""
        args = [_arg_text(a, name_of) for a in self.args]
        args += [f"{k}={_arg_text(v, name_of)}" for k, v in self.kwargs.items()]
        name = self.name
        if _is_method(self.func) and args:
            head, rest = args[0], args[1:]
            if name == "__getitem__" and rest:
                return _cut(f"{head}[{rest[0]}]")
            if name == "__setitem__" and len(rest) == 2:
                return _cut(f"{head}[{rest[0]}] = {rest[1]}")
            return _cut(f"{head}.{name}({', '.join(rest)})")
        if getattr(torch, name, None) is self.func:
            name = f"torch.{name}"
        elif getattr(torch.nn.functional, name, None) is self.func:
            name = f"F.{name}"
        return _cut(f"{name}({', '.join(args)})")


def failing_op(exc: BaseException, names: NameTable) -> FailedOp | None:
    """The torch op that raised ``exc`` (the innermost one the capture's mode saw), or None when the
    error came from elsewhere (the script's own code, a library's Python)."""
    recording = getattr(sys.modules.get("core.worker.capture.call_record"), "CallRecording", None)
    record = recording._record.__code__ if recording is not None else None  # (that module imports this one)
    found = None
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        if frame.f_code is _MODE_CODE:
            found = frame
        elif frame.f_code is record:
            return None  # raised in backward (the call's own error, or an op of a hook it ran)
    if found is None:
        return None
    local = found.f_locals
    func = local.get("func")
    if is_app_frame(getattr(getattr(func, "__code__", None), "co_filename", "")):
        return None  # the capture's own wrapper of an entry point (Tensor.backward)
    site = local.get("site") or found.f_back
    kwargs = local.get("kwargs") or {}
    return FailedOp(func=func, args=tuple(local.get("args") or ()),
                    kwargs=dict(kwargs) if isinstance(kwargs, dict) else {},
                    line=names.user_line(site), frames=names.user_frames(site))


def _is_method(func) -> bool:
    owner = getattr(func, "__objclass__", None)
    if isinstance(owner, type) and issubclass(owner, torch._C.TensorBase):
        return True
    return str(getattr(func, "__qualname__", "")).startswith("Tensor.")


def _arg_text(value, name_of) -> str:
    if isinstance(value, torch.Tensor):
        name = name_of(value)
        if name:
            return name
        shape = shape_of(value)
        return "tensor(" + "\u00d7".join(map(str, shape)) + ")"
    if value is None or isinstance(value, (bool, int, float, complex, str, torch.dtype, torch.device)):
        text = repr(value) if not isinstance(value, (torch.dtype, torch.device)) else str(value)
    elif isinstance(value, slice):
        text = ":".join("" if x is None else _arg_text(x, name_of) for x in (value.start, value.stop)) + (
            f":{_arg_text(value.step, name_of)}" if value.step is not None else "")
    elif value is Ellipsis:
        text = "..."
    elif isinstance(value, (list, tuple, torch.Size)):
        inner = ", ".join(_arg_text(v, name_of) for v in list(value)[:6]) + (", \u2026" if len(value) > 6 else "")
        text = f"({inner})" if isinstance(value, tuple) and not isinstance(value, torch.Size) else f"[{inner}]"
    else:
        text = type(value).__name__
    return text if len(text) <= ARG_CHARS else text[: ARG_CHARS - 1] + "\u2026"


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_CHARS else text[: TEXT_CHARS - 1] + "\u2026"


def failed_op_record(op: FailedOp, name_of, node_of) -> dict:
    """The trace's record of ``op`` (``core.model.forward_errors``); ``node_of(tensor)``: the id of the
    tensor's node in the partial call, or None. The caller adds ``call`` (or the error's type and message)."""
    inputs = []
    for position, t in op.tensors():
        try:
            requires, leaf = bool(t.requires_grad), bool(t.is_leaf)
        except Exception:  # a tensor subclass of the script's whose attributes raise
            requires, leaf = False, True
        inputs.append({"position": position, "name": name_of(t), "shape": shape_of(t), "dtype": dtype_name(t.dtype),
                       "requires_grad": requires, "is_leaf": leaf, "node": node_of(t)})
    return {"name": op.name, "text": op.text(name_of), "line": op.line, "inputs": inputs}
