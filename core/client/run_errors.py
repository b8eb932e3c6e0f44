"""What went wrong with a run, in words: a script that cannot be opened, a worker that died.

Qt-free; ``core.client.handle`` builds the trace's error from these when a worker vanishes mid-run.
"""

from __future__ import annotations

import errno
import os
import re
import signal
from pathlib import Path

from core.protocol import messages as protocol
from core.model.trace import CallInfo, ErrorInfo, with_fields
from core.programs.openers import read_script

STOPPED = "stopped by you"


def script_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be run or opened, in words, or None when it is a readable file."""
    p = Path(path)
    try:
        p.stat()
    except FileNotFoundError:
        if p.is_symlink():
            return f"{p}: a symbolic link to a file that does not exist"
        return f"{p}: no such file"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return f"{p}: a loop of symbolic links"
        return f"{p}: cannot be read ({exc.strerror})"
    if p.is_dir():
        return f"{p}: a folder, not a file"
    if not p.is_file():
        return f"{p}: not a regular file"
    if not os.access(p, os.R_OK):
        return f"{p}: cannot be read (permission denied)"
    return None


def death_error(code: int, fault: str, exiting: protocol.Exiting | None, script: str | None,
                reason: str = "", exited: str = "") -> ErrorInfo:
    """The structured error for a worker that vanished mid-run. ``exited``: what ended with
    ``code`` when that is not the worker itself (a launcher: "the worker on gpu-box ended
    before the run finished: kubectl exited with code 1")."""
    line = None
    if exiting is not None:
        line = exiting.line
        message = f"the script called os._exit({exiting.code}): the worker exited with code {code}"
        kind, etype = "exit", "WorkerExited"
    elif code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        message = f"the worker died with signal {-code} ({name})"
        kind, etype = "crash", "WorkerDied"
    else:
        message = exited or f"the worker exited with code {code} before the run finished"
        kind, etype = "exit", "WorkerExited"
    if line is None and script:
        line = script_line_in_fault(fault, script)
    if reason == STOPPED:
        where = f" at line {line}" if line else ""
        return ErrorInfo(type="Stopped", message=f"stopped by you{where}", line=line, kind="cancelled",
                         fault=fault.strip(), file=script)
    if reason:
        message = f"{reason}; {message}"
        kind = "timeout" if "time limit" in reason else "cancelled" if "cancel" in reason else kind
    return ErrorInfo(type=etype, message=message, line=line, kind=kind, fault=fault.strip(), file=script)


def script_line_in_fault(fault: str, script: str) -> int | None:
    """The innermost line of ``script`` in a faulthandler dump (which lists innermost first)."""
    pattern = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
    target = str(Path(script).resolve())
    for m in pattern.finditer(fault):
        if m.group("file") == target or m.group("file") == script:
            return int(m.group("line"))
    return None


def summary_dict(call: dict | CallInfo) -> dict | CallInfo:
    """A streamed call reduced to its summary, as the capture reduces repeated calls in a loop."""
    if isinstance(call, CallInfo):  # sent in columns (core.protocol.columns)
        return with_fields(call, nodes=[], tensors=[], storages=[], roots=[], snapshot="summary")
    return {**call, "nodes": [], "tensors": [], "storages": [], "roots": [], "snapshot": "summary"}


def _source(path: str) -> str:
    try:
        return read_script(path)
    except (OSError, ValueError):
        return ""
