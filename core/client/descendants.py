"""The processes below a worker, ended with it (app side, psutil).

Killing the worker's process group misses what a script started with ``setsid``
(``Popen(start_new_session=True)``, a daemon's fork + setsid). While the worker lives those
are still below it: its own children, or, once their parent exits, handed to it (on Linux the
worker is a child subreaper, ``core.worker.children``). So before a worker is killed its tree
is read, stopped and killed with it. Once a worker has exited, its tree is no longer its own
and is left alone (the worker ends it as it leaves).
"""

from __future__ import annotations

import os
import subprocess

import psutil

ROUNDS = 8  # times the tree is read again for children forked while it was being stopped


def end_descendants(proc: subprocess.Popen) -> int:
    """Stop the running worker ``proc`` and every process below it, then kill those below it
    (the worker itself is left stopped, for the caller to kill); returns how many were killed."""
    if proc.poll() is not None:
        return 0  # exited: its pid may already belong to another process
    try:
        worker = psutil.Process(proc.pid)
        if worker.ppid() != os.getpid():
            return 0
        worker.suspend()  # it starts no new child meanwhile
    except psutil.Error:
        return 0
    stopped: dict[int, psutil.Process] = {}
    for _ in range(ROUNDS):
        try:
            found = [p for p in worker.children(recursive=True) if p.pid not in stopped]
        except psutil.Error:
            break
        if not found:
            break
        for p in found:
            stopped[p.pid] = p
            try:
                p.suspend()
            except psutil.Error:
                pass
    for p in stopped.values():
        try:
            p.kill()
        except psutil.Error:
            pass
    return len(stopped)
