"""The worker's side of running on another machine (standard library only).

A remote worker cannot read the app's files or receive its signals, so:

- the script's text (and, when asked, the folder beside it as a tar.gz) arrives in the
  ``run`` command and is written to a temporary folder; it runs there, or in ``remote_cwd``
  when the data already sits in a folder on that machine; paths in the trace are mapped back
  to the app's own path so lines and errors point at the file the user has open;
- a ``dump`` command replaces SIGUSR1: every thread's stack is sent back as a ``fault``
  message before a run that passed its time limit is ended;
- the worker leads its own process group, and when its stdin closes while a script runs
  (the ssh connection dropped, the app was killed) it ends that whole group, so nothing it
  started (DDP ranks, data loader workers) is left running on the host; so it does when
  nothing can reach the app any more (``pipe_closed``: the script closed its pipe to the app, or
  a link on the way closed its end), after a line on stderr that tells the app which.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

# Imported now: while a script runs the app's modules are out of sys.modules (core.worker.main).
from core.worker import ddp
from core.worker.children import end_descendants
from core.protocol import messages as protocol
from core.protocol import uploads
from core.protocol.folders import unpack_folder
from core.model.trace import ErrorInfo, Trace

# Where the worker's own words for the app go behind a launcher (a crash's dump, ``pipe_closed``'s
# line): a private copy of stderr (core.worker.main), which a script that points its fd 2 at
# /dev/null, or closes it, does not reach.
REPORT_FD = 2
_write = os.write  # bound before any script runs: one that replaces os.write does not silence the line


def become_group_leader() -> None:
    """Lead a new session, so ending the group ends everything this worker started."""
    if hasattr(os, "setsid"):
        try:
            os.setsid()
        except OSError:
            pass  # already a session leader (sshd made one)


def end_group() -> None:
    """Kill this worker's process group (the worker included); used when the connection drops."""
    try:
        sys.stderr.flush()
    except Exception:
        pass
    ddp.end_children()
    uploads.remove_all()  # the run's folder and files sent for it: nothing stays on the host
    end_descendants()  # those that left the group with setsid (the worker is their subreaper)
    if hasattr(os, "killpg") and os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os._exit(1)


def pipe_closed(by_script: bool) -> None:
    """Nothing can reach the app any more, and behind a launcher there is no fallback file: the
    script closed or replaced the pipe to the app (``by_script``), or the pipe's far end closed
    (a link on the way went down). The run ends now, with everything it started, after a line
    on stderr that tells the app which, instead of running on, unheard, to its time limit."""
    line = protocol.PIPE_CLOSED if by_script else protocol.PIPE_BROKEN
    for fd in dict.fromkeys((REPORT_FD, 2)):  # stderr itself where the script closed the private copy too
        try:
            _write(fd, f"\n{line}; nothing more could be sent, so the run was ended\n".encode())
            break
        except OSError:
            pass
    end_group()


def dump_stacks() -> str:
    """Every thread's stack, as faulthandler writes it (the main thread may be stuck in C)."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.flush()
        f.seek(0)
        return f.read()


class Materialized:
    """The script (or saved model) written on this machine for one run, and the folder it runs in.

    The folder is the inbox the run's files were sent into (``core.protocol.uploads``), or a new one; a
    model sent as a file is ``uploads["main"]`` there, and ``uploads["weights"]`` replaces the
    run's ``load["weights"]``.
    """

    def __init__(self, cmd: dict, inbox: uploads.Inbox | None = None):
        self.local_path = str(cmd.get("path", "script.py"))
        name = os.path.basename(str(cmd.get("name") or Path(self.local_path).name)) or "script.py"
        self.cwd = os.path.expanduser(cmd["remote_cwd"]) if cmd.get("remote_cwd") else None
        sent = cmd.get("uploads") or {}
        folder, error = inbox.take() if inbox is not None else (None, "")
        self.tmp = folder or tempfile.mkdtemp(prefix="backprop-studio-")
        uploads.INBOXES.add(self.tmp)  # removed with the worker if the connection drops mid-run
        self.load = dict(cmd.get("load") or {})
        self.local_weights = self.load.get("weights")
        try:
            if self.cwd is not None and not os.path.isdir(self.cwd):
                raise FileNotFoundError(f"--remote-cwd {cmd['remote_cwd']}: no such folder on {socket.gethostname()}")
            if error:
                raise uploads.UploadError(f"a file sent for this run did not arrive whole on "
                                          f"{socket.gethostname()}: {error}")
            folder = cmd.get("folder")
            if folder:
                unpack_folder(folder, self.tmp)
            self.path = self._sent(sent["main"]) if sent.get("main") else os.path.join(self.tmp, name)
            if "source" in cmd:
                with open(self.path, "w", encoding="utf-8") as f:
                    f.write(cmd["source"])
            if sent.get("weights"):
                self.load["weights"] = self._sent(sent["weights"])
        except BaseException:
            self.cleanup()
            raise

    def _sent(self, name: str) -> str:
        path = os.path.join(self.tmp, *Path(name).parts)
        if not os.path.exists(path):
            raise uploads.UploadError(f"{name} was not sent with the run")
        return path

    def cleanup(self) -> None:
        uploads.remove_folder(self.tmp)

    def unplace(self, text: str) -> str:
        """``text`` with this machine's paths of the run's files replaced by the app's."""
        if not text:
            return text
        if self.local_weights and self.load.get("weights") != self.local_weights:
            text = text.replace(self.load["weights"], self.local_weights)
        return text.replace(self.path, self.local_path)

    def restore(self, trace: Trace) -> Trace:
        """The trace with this machine's temporary path replaced by the app's path."""
        def fix(err):
            if err is None:
                return None
            return replace(err, file=self.local_path if err.file in (self.path, None) else err.file,
                           message=self.unplace(err.message), traceback=self.unplace(err.traceback),
                           fault=self.unplace(err.fault))

        calls = [replace(c, error=fix(c.error)) if c.error is not None else c for c in trace.calls]
        source = self.unplace(trace.source)
        return replace(trace, script=self.local_path, error=fix(trace.error), calls=calls, source=source)


def run_materialized(worker, cmd: dict) -> None:
    """Write the travelling script here, run it like a local one, and map its paths back."""
    try:
        place = Materialized(cmd, getattr(worker, "inbox", None))
    except Exception as exc:
        err = ErrorInfo(type=type(exc).__name__, kind="load", message=str(exc))
        trace = Trace(calls=[], error=err, script=str(cmd.get("path", "")), device=cmd.get("device") or "cpu")
        worker.channel.send(protocol.Started(run=cmd.get("run"), t=time.time()).to_dict())
        worker.channel.send(protocol.TraceDone(trace=trace.to_dict(), run=cmd.get("run")).to_dict())
        return
    worker.channel.send({"type": "placed", "run": cmd.get("run"), "path": place.path, "local": place.local_path})
    inner = {k: v for k, v in cmd.items() if k not in ("source", "folder", "name", "remote_cwd", "uploads")}
    inner.update(path=place.path, cwd=place.cwd)
    if place.load:
        inner["load"] = place.load
    worker.finish = place.restore
    try:
        worker.run(inner)
    finally:
        worker.finish = None
        place.cleanup()
