"""Where a worker runs: the local interpreter, or any command whose stdin/stdout are the worker's.

The protocol is JSON lines over pipes, so a worker can sit behind ``ssh gpu-box python3 -m
core.worker``, ``srun --pty=no ... python -m core.worker``, ``docker exec -i CONTAINER python
-m core.worker`` or ``kubectl exec -i POD -- python -m core.worker``: the app starts that
command, writes commands to its stdin and reads the worker's messages from its stdout and
the script's output from its stderr. ``ssh`` uses the user's own ``~/.ssh/config``, keys and
agent (BatchMode: the app never asks for or stores a password).

A *host* is a plain record (saved by the app in its settings)::

    {"name": "gpu-box", "kind": "ssh", "dest": "me@gpu-box", "python": "python3",
     "remote_cwd": "/data/run1", "send_folder": false}
    {"name": "slurm-a100", "kind": "command",
     "command": "srun -p gpu --gres=gpu:1 python -m core.worker"}

``resolve(spec, hosts)`` turns a host name, or any ssh destination (``user@host``, a
``~/.ssh/config`` alias) when no host has that name, into a ``Launcher``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from core.client.bootstrap import remote_command, with_bootstrap
from core.client.run_errors import death_error
from core.model.trace import ErrorInfo
from core.protocol import messages as protocol
from core.protocol.folders import pack_folder
from core.protocol.uploads import is_text_script, plan, send_files
from core.protocol.wire import ENCODINGS, RAW, available_codecs

WORKER_MODULE = "core.worker"
DEFAULT_PYTHON = "python3"
CODECS = ("zlib", "zstd", "none")
SSH_CONNECT_TIMEOUT = 20  # seconds ssh may take to reach a host
SSH_FAILED = 255  # ssh's exit code for its own errors (a remote command's code is passed on)


class LauncherError(ValueError):
    """A host record or worker command that cannot start a worker; the message names the field."""


@dataclass(frozen=True)
class Launcher:
    """How to start one remote worker and what to send it with each run."""

    name: str  # shown in the device picker before each device ("gpu-box: cuda:0")
    argv: tuple[str, ...]  # the command; its stdin/stdout/stderr become the worker's
    kind: str = "command"  # "ssh" or "command"
    compress: str = "zlib"  # how traces travel back: zlib, zstd (where installed) or none
    remote_cwd: str | None = None  # run the script in this remote folder instead of a temporary one
    send_folder: bool = False  # also send the files beside the script
    env: dict = field(default_factory=dict)  # extra environment for the local command (tests, PATH)
    send_code: bool = False  # the command ends in a bare interpreter: the worker's code goes down stdin

    def describe(self) -> str:
        if not self.send_code:
            return f"{self.name} ({shlex.join(self.argv)})"
        # the bootstrap program is two words at the end, or the tail of ssh's remote command
        argv = self.argv
        words = list(argv[:-2]) if argv[-2:-1] == ("-c",) else [*argv[:-1], argv[-1].split(" -c ")[0]]
        return f"{self.name} ({shlex.join(words)}, the worker's code sent)"

    @property
    def program(self) -> str:
        """The command's program, as messages name it: "ssh", "kubectl", "sh"."""
        return os.path.basename(self.argv[0])


def worker_command(python: str = DEFAULT_PYTHON) -> str:
    """The remote shell command that starts a worker with ``python``."""
    return f"{python} -m {WORKER_MODULE}"


def shell_python(python: str, what: str = "'python'") -> str:
    """A host's ``python`` field as the remote shell is to run it: split into words as a POSIX
    shell would (``conda run -n t python``, ``'/opt/my env/bin/python'``) and each word quoted,
    so nothing in it (``;``, ``|``, ``$(...)``, a backquote) runs as a command of its own. A
    leading ``~/`` is left to the remote shell, which expands it to the remote home."""
    try:
        words = shlex.split(python)
    except ValueError as exc:
        raise LauncherError(f"{what}: {exc} in {python!r}") from None
    if not words:
        raise LauncherError(f"{what} is empty: give the interpreter to run on the host, such as {DEFAULT_PYTHON!r}")
    return " ".join(_home_kept(w) for w in words)


def _home_kept(word: str) -> str:
    if word == "~" or word == "~/":
        return word
    if word.startswith("~/"):
        return "~/" + shlex.quote(word[2:])
    return shlex.quote(word)


def ssh_argv(dest: str, python: str = DEFAULT_PYTHON, ssh: str | None = None,
             options: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``ssh`` with no terminal, no password prompt, a keep-alive and a limit on connecting
    (an unreachable host says so in 20 s, not after the system's two minutes), running the
    worker on ``dest`` (its code sent by the app where ``python`` is a bare interpreter:
    ``core.client.bootstrap``)."""
    exe = ssh or shutil.which("ssh") or "ssh"
    return (exe, "-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=15", "-o",
            f"ConnectTimeout={SSH_CONNECT_TIMEOUT}", *options, "--", dest, remote_command(shell_python(python))[0])


# What ssh(1) takes as its destination: [user@]host (a ~/.ssh/config alias, a name, an IPv4 or
# IPv6 address) or the URI ssh://[user@]host[:port], where a host off port 22 is named.
_DEST = re.compile(r"^(?:(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9._:\[\]-]+"
                   r"|ssh://(?:[A-Za-z0-9._-]+@)?(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?)$")
DEST_FORMS = "user@host, ssh://user@host:port or a ~/.ssh/config alias"


def from_host(host: dict) -> Launcher:
    """A launcher from a saved host record; a bad record raises LauncherError naming the field."""
    name = str(host.get("name") or "").strip()
    if not name:
        raise LauncherError("host record: 'name' is empty")
    kind = host.get("kind", "ssh")
    compress = host.get("compress", "zlib")
    if compress not in CODECS:
        raise LauncherError(f"host '{name}': 'compress' must be one of {', '.join(CODECS)}, not {compress!r}")
    common = dict(name=name, compress=compress, remote_cwd=host.get("remote_cwd") or None,
                  send_folder=bool(host.get("send_folder", False)))
    if kind == "ssh":
        dest = str(host.get("dest") or name)
        if not _DEST.match(dest):
            raise LauncherError(f"host '{name}': 'dest' {dest!r} is not an ssh destination ({DEST_FORMS})")
        options = tuple(shlex.split(host.get("ssh_options", "")))
        python = shell_python(str(host.get("python") or DEFAULT_PYTHON), f"host '{name}': 'python'")
        return Launcher(argv=ssh_argv(dest, python, options=options), kind="ssh",
                        send_code=remote_command(python)[1], **common)
    if kind == "command":
        argv, send = with_bootstrap(split_command(host.get("command", ""), f"host '{name}': 'command'"))
        return Launcher(argv=argv, send_code=send, **common)
    raise LauncherError(f"host '{name}': 'kind' must be 'ssh' or 'command', not {kind!r}")


def split_command(command: str, what: str = "--worker-command") -> tuple[str, ...]:
    """A worker command line split like a POSIX shell would, or LauncherError saying what is wrong."""
    try:
        argv = tuple(shlex.split(command or ""))
    except ValueError as exc:
        raise LauncherError(f"{what}: {exc} in {command!r}") from None
    if not argv:
        raise LauncherError(f"{what} is empty: give the command that starts "
                            f"'{worker_command()}' with its stdin and stdout as the worker's")
    return argv


def from_command(command: str, name: str | None = None, **options) -> Launcher:
    """A launcher from a whole command line (``--worker-command "docker exec -i box python -m core.worker"``);
    one that ends in a bare interpreter (``"docker exec -i box python"``) gets the worker's code sent."""
    argv = split_command(command)
    name = name or os.path.basename(argv[0])
    argv, send = with_bootstrap(argv)
    return Launcher(name=name, argv=argv, send_code=send, **options)


def resolve(spec: str, hosts: list[dict] | None = None, **options) -> Launcher:
    """``--host SPEC``: a saved host by name, else ``SPEC`` taken as an ssh destination."""
    for host in hosts or []:
        if host.get("name") == spec:
            launcher = from_host(host)
            break
    else:
        if not spec or not _DEST.match(spec):
            raise LauncherError(f"--host {spec!r}: no saved host has that name, and it is not an ssh "
                                f"destination ({DEST_FORMS})")
        launcher = from_host({"name": spec, "kind": "ssh", "dest": spec})
    return replace_options(launcher, **options)


def replace_options(launcher: Launcher, **options) -> Launcher:
    given = {k: v for k, v in options.items() if v is not None}
    return replace(launcher, **given) if given else launcher


# -- the app's side of the pipe --------------------------------------------------------------------
def missing_command(launcher: Launcher, exc: OSError) -> list[str]:
    """A stand-in process that says why the launcher's command could not start, and exits 127."""
    text = f"cannot start {launcher.argv[0]!r}: {exc.strerror or exc}"
    return [sys.executable, "-c", f"import sys; sys.stderr.write({text!r}); sys.exit(127)"]


def fault_in_output(output: str) -> str:
    """The faulthandler dump a crashed remote worker wrote into its output, or ''."""
    for marker in ("Fatal Python error", "Thread 0x", "Current thread 0x"):
        at = output.find(marker)
        if at >= 0:
            return output[at:]
    return ""


def transfer_progress(deliver):
    """``on_progress`` for core.protocol.wire.StreamDecoder: ``transfer`` messages, at most one per 256 KiB
    received (a dozen for the 3.6 MB of the 50,000-node example)."""
    last = {"got": 0, "done": None}

    def progress(header: dict, got: int, decoded: int) -> None:
        raw = int(header.get("raw") or 0)
        if decoded >= raw:
            if last["done"] is header:
                return  # the end was already reported
            last["done"], last["got"] = header, 0
        elif got - last["got"] >= 1 << 18:
            last["got"] = got
        else:
            return
        deliver({"type": "transfer", "of": header.get("of"), "received": got, "decoded": decoded,
                 "raw": raw, "codec": header.get("codec")})

    return progress


def launcher_error(worker, code: int | None, script: str, reason: str):
    """The error for a run whose worker behind a launcher vanished (or never started)."""
    with worker._lock:
        said = worker.output_tail.decode("utf-8", errors="replace")
    if worker.refused:
        return ErrorInfo(type="ProtocolMismatch", message=worker.refused, kind="load")
    if worker.hello is None and code is not None and not reason:
        return ErrorInfo(type="LauncherError", message=start_failure(worker.launcher, code, said), kind="load")
    fault = worker.fault_text()
    ended = None if reason or worker.exiting is not None else _ended_on_the_way(worker, code, said, fault)
    if ended is not None:
        etype, kind, message = ended
        return ErrorInfo(type=etype, kind=kind, message=message, file=script)
    code = remote_exit_code(code if code is not None else -9, fault)
    # The code is the launcher's: the worker's own where the launcher passes it on (sh -c 'exec
    # …', ssh), its own where it failed (a kubectl that lost its pod, a link that ended).
    exited = (f"the worker on {worker.launcher.name} ended before the run finished: "
              f"{worker.launcher.program} exited with code {code}")
    return death_error(code, fault, worker.exiting, script, reason, exited)


# ssh's own words when the connection, not the remote command, ended (OpenSSH client messages).
SSH_DROPPED = re.compile(r"^(Connection to \S+ closed|Connection reset|client_loop: |packet_write_wait: "
                         r"|Timeout, server \S+ not responding|ssh_dispatch_run_fatal: |Write failed: |Broken pipe)")


def _ended_on_the_way(worker, code: int | None, said: str, fault: str) -> tuple[str, str, str] | None:
    """(error type, kind, message) for a run behind a launcher that ended, after the worker's
    hello, through its pipe or its connection rather than its script; None otherwise:

    - the worker's own line on stderr (``core.worker.remote.pipe_closed``): the script closed
      the pipe to the app, or the pipe's far end closed;
    - its messages stopped while the command still ran (``hung_up``): the app ended it;
    - ssh exited with 255 after a line of its own about the connection;
    - ssh exited with 255 saying nothing, and the worker left no dump: the remote process died
      of a signal that leaves none (SIGKILL), which ssh does not name."""
    launcher, name = worker.launcher, worker.launcher.name
    if protocol.PIPE_CLOSED in said[-4096:]:
        return "PipeClosed", "disconnected", (f"the script closed the worker's pipe to the app, so nothing more "
                                              f"could come back from {name}: the worker ended the run")
    # A far end that closed after the app ended the run itself (its messages had stopped) closed
    # because the app ended the link: the app's reason comes first.
    if protocol.PIPE_BROKEN in (worker.said_at_hang_up if worker.hung_up else said)[-4096:]:
        return "ConnectionLost", "disconnected", (
            f"the link from {name} closed its end of the worker's pipe before the run finished, so nothing more "
            f"could come back: the worker ended the run")
    if worker.hung_up:
        return "ConnectionLost", "disconnected", (
            f"the worker's messages from {name} stopped before the run finished, while "
            f"{launcher.program} still ran (the link dropped, or the script closed the worker's "
            f"pipe); the app ended it")
    if launcher.kind != "ssh" or code != SSH_FAILED:
        return None
    last = last_line(said)
    if SSH_DROPPED.match(last):
        return "ConnectionLost", "disconnected", (
            f"the connection to {name} closed before the run finished (ssh exited with code {SSH_FAILED}: "
            f"{last}); the worker there is ended with it")
    if not fault:
        return "WorkerDied", "crash", (
            f"the worker on {name} ended without a word: ssh exited with code {SSH_FAILED}, as it does when the "
            f"remote process is killed by a signal (the out-of-memory killer's SIGKILL, for one)")
    return None


def last_line(output: str) -> str:
    """The last line of ``output`` that is not blank, stripped ("" when there is none)."""
    lines = output.strip().splitlines()
    return lines[-1].strip() if lines else ""


def run_payload(launcher: Launcher, path: str, load: dict | None = None) -> dict:
    """What a ``run`` command carries to a remote worker besides the local one's fields.

    A script or notebook travels as ``source``; a saved model, a Hugging Face folder and
    ``--weights`` travel as files sent before the command (``core.protocol.uploads``): they are listed
    under ``_files`` for ``send_run_files``, which takes them out of the payload.
    """
    p = Path(path)
    # zstd only where this side can read it; the worker falls back to zlib where it has none.
    # "none": the columns as they are (raw frames; a worker that knows no raw sends zlib).
    codec = launcher.compress if launcher.compress in available_codecs() else \
        RAW if launcher.compress == "none" else "zlib"
    payload = {"name": p.name, "compress": codec, "encodings": ENCODINGS}
    if is_text_script(p):
        payload["source"] = p.read_text(encoding="utf-8")
    uploads, files = plan(p, load)
    if uploads:
        payload["uploads"] = uploads
        payload["_files"] = files
    if launcher.remote_cwd:
        payload["remote_cwd"] = launcher.remote_cwd
    if launcher.send_folder and p.is_file():
        payload["folder"] = pack_folder(p.parent, skip=str(p))
    return payload


def send_run_files(worker, files: list, on_event=None, wanted=lambda: True) -> bool:
    """Send a run's files (``run_payload``'s ``_files``) to ``worker`` before its ``run`` command,
    compressed with the launcher's codec where the worker's hello lists it; False when the run
    was replaced meanwhile or the worker went away."""
    codecs = (worker.hello or {}).get("codecs") or ["zlib"]
    asked = worker.launcher.compress if worker.launcher is not None else "zlib"
    codec = None if asked == "none" else (asked if asked in codecs else "zlib")
    stdin = worker.proc.stdin if worker.proc is not None else None
    if stdin is None:
        return False

    def write(data: bytes) -> None:
        stdin.write(data)  # one write per piece: a command sent meanwhile passes between two
        stdin.flush()

    return send_files(write, files, codec, on_event, wanted)


_FATAL = {"Segmentation fault": 11, "Aborted": 6, "Floating point exception": 8, "Bus error": 7,
          "Illegal instruction": 4}


def remote_exit_code(code: int, fault: str) -> int:
    """The exit code as a local worker would report it: a remote shell turns signal N into
    128+N and ssh may say 255, but the faulthandler dump names the signal."""
    for text, signum in _FATAL.items():
        if f"Fatal Python error: {text}" in fault:
            return -signum
    if 128 < code < 160:
        return -(code - 128)
    return code


def start_failure(launcher: Launcher, code: int, output: str) -> str:
    """Why a worker behind ``launcher`` never said hello, with the launcher's last words."""
    last = last_line(output)
    said = f": {last}" if last else ""
    hint = ""
    if launcher.kind == "ssh" and code == SSH_FAILED:
        hint = " (check that 'ssh' to it works without a password prompt: keys or an agent)"
    elif code == 127 or "No module named" in output:
        hint = (" (is Python with torch there? set the host's python)" if launcher.send_code else
                " (is Python with torch and Backprop Studio installed there? set the host's python)")
    return (f"the worker on {launcher.name} did not start: {launcher.program} exited with "
            f"code {code}{said}{hint}")
