"""The script's errors as the app shows them: its own line and a traceback without the capture's frames."""

from __future__ import annotations

import traceback
from pathlib import Path

import torch

from core.worker.capture.creation import safe_str
from core.worker.capture.names import OP_FRAME, NameTable
from core.model.trace import ErrorInfo

# Frames of these files are the capture's own (the wrapped backward, the creation mode, the run).
_CAPTURE_FILES = tuple(str(Path(__file__).resolve().with_name(f)) for f in ("recorder.py", "call_record.py",
                                                                            "creation.py"))


def script_line(exc: BaseException, names: NameTable) -> int | None:
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if names.is_user_file(frame.f_code.co_filename) and frame.f_code.co_filename == names.script_path:
            line = lineno
    return line


def format_tb(exc: BaseException, names: NameTable) -> str:
    """The traceback from the script's first frame on, without the capture's own frames."""
    tb = exc.__traceback__
    while tb is not None and not names.is_user_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    lines = traceback.format_exception(type(exc), exc, tb)
    # Each frame is one chunk (its "File" line with its source lines); the exception's own
    # message is the last chunk and is always kept.
    return "".join(chunk for chunk in lines
                   if not (chunk.lstrip().startswith(tuple(f'File "{f}"' for f in _CAPTURE_FILES)) or f", in {OP_FRAME}\n" in chunk))


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
