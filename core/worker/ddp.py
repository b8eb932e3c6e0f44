"""DDP scripts captured per rank: the worker launches ``torchrun`` on its own host.

``torchrun --standalone --nproc_per_node=N`` starts N ranks, each running
``core.worker.ddp_rank`` (capture of the script, DDP's all-reduce recorded). The worker returns the
trace of the rank the user picked (rank 0 by default) and sends every other rank's trace
before it (``rank_trace``), so the window can switch between them; each call's
``all_reduce`` option also holds every rank's local and reduced gradients.
The ranks run in their own process group, ended on Stop, time-out or a dropped connection.
torchrun starts each rank in a session of its own, out of reach of a signal to torchrun's
group; so torchrun and every rank ask the kernel to kill them when the process that started
them ends (``die_with_parent``, Linux): ending torchrun ends its ranks, and a worker killed
outright (the app's time limit, a Stop the worker did not answer) ends torchrun.

Debug and stepping pause the script inside the worker itself, so a DDP script is debugged as
``torchrun --nproc_per_node=1`` would start it: one process, rank 0 of a world of 1
(``world_of_one``), whose all-reduce averages its own gradients with nothing else.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

# Imported now: while a script runs the app's modules are out of sys.modules (core.worker.main).
from core.protocol import messages as protocol
from core.model.trace import ErrorInfo, Trace, TraceFormatError
from core.model.trace_json import load_trace

CHILD_GROUPS: set[int] = set()  # process groups to end with the worker (see worker_remote.end_group)
PARENT_ENV = "BACKPROP_STUDIO_DDP_PARENT"  # the pid of the process that started this one
# torchrun, run so that it ends with the worker that started it; the rest of argv is torchrun's.
TORCHRUN = ("import runpy, sys; from core.worker.ddp import die_with_parent; die_with_parent(); sys.argv[0] = 'torchrun'; "
            "runpy.run_module('torch.distributed.run', run_name='__main__', alter_sys=True)")


def die_with_parent() -> None:
    """Be killed (SIGKILL) when the process that started this one ends (Linux ``prctl``
    ``PR_SET_PDEATHSIG``; elsewhere nothing). ``PARENT_ENV`` names that process: if it has
    already ended, this one exits now; then it names this one, for the processes this one
    starts (torchrun's ranks)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    parent = os.environ.get(PARENT_ENV, "")
    if parent.isdigit() and os.getppid() != int(parent):
        os._exit(1)  # the parent ended before the kernel was asked
    os.environ[PARENT_ENV] = str(os.getpid())


def torchrun_argv(script: str, nproc: int, out: str, device: str, mode: str, load: dict | None = None,
                  nan_check: bool = False) -> list[str]:
    extra = ["--load", json.dumps(load)] if load else []  # how the file is opened: --weights, input shapes
    extra += ["--nan-check"] if nan_check else []  # each rank checks its own ops and gradients
    return [sys.executable, "-c", TORCHRUN, "--standalone", f"--nproc_per_node={nproc}",
            "-m", "core.worker.ddp_rank", "--out", out, "--device", device, "--mode", mode, *extra, script]


#: What torchrun sets for rank 0 of a one-process world (MASTER_PORT, a free port, is added).
ONE_PROCESS = {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "ROLE_RANK": "0", "WORLD_SIZE": "1",
               "LOCAL_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}


@contextmanager
def world_of_one():
    """The environment of ``torchrun --nproc_per_node=1`` around a DDP script run in this process:
    ``init_process_group()`` finds its rank and its one peer (itself) through env:// rendezvous.
    Variables already set are left as they are; every one is back as it was afterwards."""
    with socket.socket() as sock:  # a port nobody listens on, for the group's store
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    wanted = {**ONE_PROCESS, "MASTER_PORT": port}
    before = {key: os.environ.get(key) for key in wanted}
    for key, value in wanted.items():
        os.environ.setdefault(key, value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def end_children() -> None:
    for pgid in list(CHILD_GROUPS):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
        CHILD_GROUPS.discard(pgid)


def run_ranks(worker, cmd: dict):
    """Run ``cmd['path']`` under torchrun and return the picked rank's trace."""

    ddp = cmd.get("ddp") or {}
    nproc = int(ddp.get("nproc", 2))
    rank = int(ddp.get("rank", 0))
    device = cmd.get("device") or "cpu"
    script = str(Path(cmd["path"]).resolve())
    if not 0 <= rank < nproc:
        err = ErrorInfo(type="ValueError", kind="load", message=f"rank {rank} was asked for, but only ranks 0 to "
                                                                  f"{nproc - 1} run (--nproc {nproc})")
        return Trace(calls=[], error=err, script=script, device=device)
    out = tempfile.mkdtemp(prefix="backprop-studio-ddp-")
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env[PARENT_ENV] = str(os.getpid())
    argv = torchrun_argv(script, nproc, out, device, cmd.get("mode", "auto"), cmd.get("load"),
                         bool(cmd.get("nan_check")))
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    CHILD_GROUPS.add(proc.pid)
    try:
        code = _wait(proc)
    except KeyboardInterrupt:
        end_children()
        proc.wait()
        shutil.rmtree(out, ignore_errors=True)
        err = ErrorInfo(type="KeyboardInterrupt", message="the run was cancelled", kind="cancelled")
        return Trace(calls=[], error=err, script=script, device=device)
    finally:
        end_children()
    try:
        traces = {}
        for r in range(nproc):
            path = Path(out) / f"rank{r}.json"
            if path.is_file():
                traces[r] = load_trace(path)
    except (OSError, TraceFormatError) as exc:
        traces = {}
        load_error = str(exc)
    else:
        load_error = ""
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if rank not in traces:
        why = load_error or f"torchrun exited with code {code}"
        err = ErrorInfo(type="DDPError", kind="exit",
                        message=f"rank {rank} of {nproc} wrote no trace ({why}); the output above says why")
        return Trace(calls=[], error=err, script=script, device=device)
    send_other_ranks(worker, cmd, traces, rank, nproc)
    return with_all_ranks(traces[rank], traces)


def _wait(proc: subprocess.Popen) -> int:
    """``proc.wait()`` that Stop can interrupt: a plain wait blocks in ``waitpid``, where the
    KeyboardInterrupt Stop raises (``_thread.interrupt_main``) does not arrive until it returns."""
    while True:
        try:
            return proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            continue


def send_other_ranks(worker, cmd: dict, traces: dict, picked: int, nproc: int) -> None:
    """Each rank's trace but the picked one's, as ``rank_trace`` messages (the window's rank picker)."""
    for r, trace in sorted(traces.items()):
        if r == picked:
            continue
        trace = replace(with_all_ranks(trace, traces), device=cmd.get("device") or "cpu")
        if getattr(worker, "finish", None) is not None:  # run on another machine: the app's paths
            trace = worker.finish(trace)
        worker.channel.send(protocol.RankTrace(rank=r, nproc=nproc, trace=trace,  # the channel encodes it
                                               run=cmd.get("run")).to_dict())


def with_all_ranks(trace, traces: dict):
    """``trace`` with each call's all-reduce record listing every rank's gradients for that call."""
    calls = []
    for call in trace.calls:
        ar = call.options.get("all_reduce")
        if not ar:
            calls.append(call)
            continue
        ranks = {}
        for r, other in sorted(traces.items()):
            match = next((c for c in other.calls if c.index == call.index), None)
            if match is not None and match.options.get("all_reduce"):
                ranks[str(r)] = match.options["all_reduce"]["params"]
        calls.append(replace(call, options={**call.options, "all_reduce": {**ar, "ranks": ranks}}))
    return replace(trace, calls=calls)
