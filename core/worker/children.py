"""Every process a run starts ends with it, however it detaches (worker side; psutil where installed).

The worker leads its own process group, and ending the group ends a script's pools and
subprocesses. A child that calls ``setsid`` (``Popen(start_new_session=True)``, a daemon's
fork + setsid) leaves that group, and once its parent exits it is handed to init and outlives
the run. On Linux the worker is a child subreaper (``PR_SET_CHILD_SUBREAPER``): orphaned
descendants are handed to the worker instead, so they stay in its tree, and the worker ends its
whole tree when it leaves (after the script's ``atexit`` functions, or in ``os._exit``). The
app ends the tree before it kills a worker (``core.client.descendants``). Elsewhere nothing is
set: the process group is ended as before, and a child that left it is not followed.

An adopted orphan that exits stays a zombie until the worker leaves: the worker reaps no child
it did not start, since a wait on any child would take exit statuses from the script's own
``Popen`` objects.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import sys

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
ROUNDS = 8  # times the tree is read again for children forked while it was being stopped


def become_subreaper() -> bool:
    """Make orphaned descendants this process's children (Linux); False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
            return True
        log.warning("prctl(PR_SET_CHILD_SUBREAPER) failed: %s", os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError) as exc:
        log.warning("prctl is not available: %s", exc)
    return False


def end_descendants() -> int:
    """Kill every process below this one; returns how many were killed. Each is stopped first
    and the tree read again, so none forks a new one while it is being ended."""
    try:
        import psutil
    except ImportError:
        return 0
    try:
        me = psutil.Process()
    except psutil.Error:
        return 0
    stopped: dict[int, object] = {}
    for _ in range(ROUNDS):
        try:
            found = [p for p in me.children(recursive=True) if p.pid not in stopped]
        except psutil.Error:
            break
        if not found:
            break
        for p in found:
            stopped[p.pid] = p
            try:
                p.suspend()  # SIGSTOP; on Windows its threads are suspended
            except psutil.Error:
                pass
    for p in stopped.values():
        try:
            p.kill()
        except psutil.Error:
            pass
    return len(stopped)


def keep_children() -> bool:
    """Adopt the run's orphans and end them all when the worker leaves; True where the tree is
    followed (Linux), False where only the process group is ended."""
    adopted = become_subreaper()
    worker = os.getpid()
    real_exit = os._exit

    def _leaving() -> None:
        if os.getpid() == worker:  # a forked child that exits leaves its own children alone
            end_descendants()

    def _exit(code: int = 0) -> None:
        try:
            _leaving()
        finally:
            real_exit(code)

    atexit.register(_leaving)  # registered first, so it runs after the script's own functions
    os._exit = _exit
    return adopted
