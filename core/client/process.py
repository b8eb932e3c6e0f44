"""One worker process and the threads that read its pipes (Qt-free).

A worker serves one run: each run gets a fresh interpreter, so a script that patches torch,
leaks memory or crashes cannot affect the next one. Its messages are read on background
threads, typed (``core.protocol.messages``) and handed to ``on_message``; a message that does not
match the protocol becomes a ``BadMessage`` naming the field. When the worker ends, one
``Exit`` message carries its exit code or signal.

Every worker gets a key of its own, sent as the first line on its stdin: its messages come
sealed with it (``core.protocol.wire.Check``), and what fails the check (a line a script wrote
on the worker's descriptor or into the fallback file) is dropped and counted. Bytes that cannot
be decoded end the run at once, saying what was wrong. The fault and fallback files are read
through the descriptors ``tempfile`` made them with, so a script that puts a symbolic link or a
FIFO in their place is neither shown nor waited on.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import select
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from core.client.bootstrap import code_message
from core.client.descendants import end_descendants
from core.client.launchers import fault_in_output, missing_command, transfer_progress
from core.model.trace import paused_gc
from core.protocol import events
from core.protocol import messages as protocol
from core.protocol.wire import Check, ProtocolMismatch, StreamDecoder, check_hello, new_key, read_ahead

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
OUTPUT_TAIL = 64 * 1024
# How long a worker behind a launcher may keep running once its messages have stopped (its
# stdout closed): then it is ended, since it has no other way to send the result.
HANG_UP_GRACE = 3.0
# Before a run is ended from here, after its stacks: how long a call the worker still sends has
# to begin arriving, and how long it may take in all (core.worker.main._send_short_calls).
FRAME_START = 0.3
FRAME_CAP = 10.0
# A frame from which no byte has come for this long is not on its way (the worker stopped
# in the middle of it): the run is ended without waiting out FRAME_CAP.
FRAME_STALL = 2.0
# How long a command waits for the worker's code to go down the pipe before it (core.client.bootstrap):
# as long as the launcher takes to reach its host and start the interpreter.
CODE_WAIT = 60.0
HELD_FILE_CAP = 64 << 20  # the most read back from the fault or fallback file


class WorkerProcess:
    """One worker interpreter, in its own session and process group, and the threads that read its pipes.

    The worker's children (a ``multiprocessing`` pool, a ``subprocess``) share its process
    group: killing and closing signal the whole group (as Jupyter does with kernels), so no
    child outlives the run and no inherited pipe keeps a reader waiting. The fault file is
    made by ``tempfile`` (0600, exclusive create) and removed with ``cleanup()``.
    """

    _ids = itertools.count()

    def __init__(self, on_message: Callable[[protocol._Base], None], python: str | None = None, launcher=None):
        self.on_message = on_message
        self.launcher = launcher  # a core.client.launchers.Launcher: the worker runs behind that command
        self.python = python or sys.executable
        self.id = next(self._ids)
        # A worker behind a launcher cannot write our files: its stacks come back as messages.
        # Each is held open from its creation and read through that descriptor (see above).
        self.fault_path, self._fault_fd = _private_temp("fault", ".txt") if launcher is None else (None, None)
        self.fallback_path, self._fallback_fd = _private_temp("result", ".jsonl") if launcher is None else (None, None)
        self.check: Check | None = None  # opens the worker's sealed messages (made with its key at start)
        self.stream_error = ""  # why the protocol stream could not be decoded (the run was ended)
        self.refused = ""  # why the worker's hello was refused (another protocol version)
        self.remote_fault = ""  # stacks a remote worker sent back in answer to ``dump``
        self.frame_at = 0.0  # when the last chunk of a frame (a trace, a captured call) arrived
        self.bytes_at = 0.0  # when the decoder last finished taking in bytes of the protocol stream
        self.feeding = False  # the decoder is taking in what arrived
        self._decoder = None  # the protocol stream's reader, while it reads
        self.placed = ("", "")  # (path on the worker's host, the app's path) of a travelling script
        self.proc: subprocess.Popen | None = None
        self.hello: protocol.Hello | None = None
        self.ready = threading.Event()
        self.output_tail = bytearray()
        self.output_bytes = 0
        self.exiting: protocol.Exiting | None = None
        self.cut_off = ""  # what the stream ended in the middle of, in words (core.protocol.wire.cut_words)
        self.hung_up = False  # its messages stopped while the launcher still ran: the app ended it
        self.said_at_hang_up = ""  # the worker's last words when the app ended it so (what came after, it caused)
        self._lock = threading.Lock()
        self.finished = threading.Event()
        self._output_done = threading.Event()
        self._exited = threading.Event()
        self._fault_cache: str | None = None
        self._code_sent = threading.Event()  # set once nothing more is to be written before commands
        self._held_lock = threading.Lock()
        self._unlinked = False  # cleanup() removed the files: their descriptors close once nothing reads them

    def start(self) -> None:
        env = dict(os.environ)
        # The worker restores the user's PYTHONPATH before the script runs (its children inherit it).
        env["BACKPROP_STUDIO_PYTHONPATH"] = env.get("PYTHONPATH", "")
        sends_code = self.launcher is not None and self.launcher.send_code
        if not sends_code:  # a worker whose code the app sends imports it from its own folder, not this tree
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONFAULTHANDLER"] = "1"
        cmd = [self.python, "-m", "core.worker"]
        if self.fault_path:
            cmd += ["--fault-file", str(self.fault_path)]
        key = new_key()
        self.check = Check(key, required=self.launcher is None)  # a launcher's worker may be one that does not seal
        setup = {"cmd": "channel", "key": key.hex()}  # on stdin: arguments and environment are the script's to read
        if self.fallback_path:
            setup["fallback"] = str(self.fallback_path)
        preamble = (json.dumps(setup) + "\n").encode()
        if self.launcher is not None:
            cmd = list(self.launcher.argv)
            env.update(self.launcher.env)
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=str(ROOT),
                env=env,
                start_new_session=hasattr(os, "killpg"),
            )
        except OSError as exc:
            if self.launcher is None:
                raise
            # ssh / docker / kubectl not installed: reported like any worker that did not start.
            self.proc = subprocess.Popen(missing_command(self.launcher, exc), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            sends_code = False
        # The bootstrap reads the code before anything else (core.client.bootstrap), the worker
        # the channel's set-up line; commands wait until both are down the pipe.
        threading.Thread(target=self._send_preamble, args=(sends_code, preamble), name=f"worker-{self.id}-code",
                         daemon=True).start()
        threading.Thread(target=self._wait, name=f"worker-{self.id}-wait", daemon=True).start()
        threading.Thread(target=self._read_protocol, name=f"worker-{self.id}-proto", daemon=True).start()
        threading.Thread(target=self._read_output, name=f"worker-{self.id}-output", daemon=True).start()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _send_preamble(self, code: bool, setup: bytes) -> None:
        """Write the worker's packed code (where it travels) and the channel's set-up line down
        its stdin; commands wait until they are all there."""
        try:
            self.proc.stdin.write((code_message() if code else b"") + setup)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass  # the command ended first: its exit is reported like any worker that did not start
        finally:
            self._code_sent.set()

    def send(self, msg: dict) -> bool:
        if not self.alive or not self._code_sent.wait(CODE_WAIT):
            return False
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def dump_stacks(self, signal_too: bool = True) -> None:
        """Ask faulthandler in the worker to write every thread's stack to the fault file.

        Two ways, so a script that ignores SIGUSR1 (or holds the GIL in C) is still named:
        a command read on the worker's command thread, and the signal.
        """
        self.send(protocol.Dump().to_dict())
        if signal_too:
            self._signal_dump()

    def _signal_dump(self) -> None:
        if self.alive and hasattr(signal, "SIGUSR1"):
            try:
                self.proc.send_signal(signal.SIGUSR1)
            except OSError:
                pass

    def dump_and_wait(self, limit: float = 2.0) -> None:
        """Ask for a stack dump and wait (up to ``limit`` s) until the fault file stops growing,
        then while a call the worker sends after it arrives (``_let_frames_arrive``).

        The command goes first and the signal only if no dump came of it: two dumps written at
        once interleave their lines in the file, and the script's line could not be read back.
        """
        if self.launcher is not None:  # signals do not cross ssh: the stacks come back as a message
            self.send(protocol.Dump().to_dict())
            deadline = time.monotonic() + limit
            while not self.remote_fault and self.alive and time.monotonic() < deadline:
                time.sleep(0.05)
        else:
            before = self._fault_size()
            self.dump_stacks(signal_too=False)
            first = min(0.6, limit / 2)
            if not self._wait_for_dump(before, first):
                self._signal_dump()
                self._wait_for_dump(before, limit - first)
        self._let_frames_arrive()

    def _let_frames_arrive(self, start: float = FRAME_START, cap: float = FRAME_CAP,
                           stall: float = FRAME_STALL) -> None:
        """After its stacks the worker sends a loop's last call whole, if it streamed it as its
        summary (``Worker._send_short_calls``): wait up to ``start`` s for it to begin, then while
        it arrives, ``cap`` s at most, so that a slow link does not cut it off; a frame from
        which nothing has come for ``stall`` s is not arriving."""
        began = time.monotonic()
        while self.alive:
            now = time.monotonic()
            decoder = self._decoder
            if now - began >= cap:
                return
            if decoder is not None and decoder.partial:
                if not self.feeding and now - max(self.bytes_at, began) >= stall:
                    return  # stuck in the middle: nothing more of it comes
            elif now - began >= start or self.frame_at > began:
                return  # no frame on its way: none came, or the one that came is whole
            time.sleep(0.05)

    def _wait_for_dump(self, before: int, limit: float) -> bool:
        """Wait until the fault file has grown past ``before`` and stopped growing."""
        deadline = time.monotonic() + limit
        last, stable_since = self._fault_size(), None
        while time.monotonic() < deadline and self.alive:
            time.sleep(0.05)
            size = self._fault_size()
            if size > before and size == last:
                stable_since = stable_since or time.monotonic()
                if time.monotonic() - stable_since >= 0.15:
                    return True
            else:
                stable_since = None
            last = size
        return False

    def _fault_size(self) -> int:
        try:
            return os.fstat(self._fault_fd).st_size if self._fault_fd is not None else 0
        except OSError:
            return 0

    def kill(self) -> None:
        """Kill the worker, every process in its group and every process below it."""
        if self.proc is None:
            return
        if self.launcher is None:  # a launcher's worker ends its own tree on its host
            end_descendants(self.proc)  # those that left the group with setsid
        if hasattr(os, "killpg"):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except OSError:
                pass

    def close(self, wait: float = 2.0) -> None:
        """Ask the worker to quit, then kill what is left of its group and remove its files."""
        if self.alive:
            self.send(protocol.Quit().to_dict())
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            self.finished.wait(timeout=5)
            self._close_pipes()
        self.cleanup()

    def cleanup(self) -> None:
        """Remove the fault and fallback files (the fault text is kept in memory first)."""
        self.fault_text()
        for path in (self.fault_path, self.fallback_path):
            if path is not None:
                try:
                    path.unlink()  # whatever is there now: unlink removes a planted link, not its target
                except OSError:
                    pass
        with self._held_lock:
            self._unlinked = True
            if self.finished.is_set():  # else the protocol reader closes them once it has read the fallback
                self._close_held()

    def _close_held(self) -> None:
        """Close the descriptors of the fault and fallback files (the fault text is kept first)."""
        self._fault_cache = self.fault_text()
        for name in ("_fault_fd", "_fallback_fd"):
            fd = getattr(self, name)
            setattr(self, name, None)
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def fault_text(self) -> str:
        if self.launcher is not None:
            with self._lock:
                tail = self.output_tail.decode("utf-8", errors="replace")
            text = self.remote_fault or fault_in_output(tail)
            return text.replace(*self.placed) if self.placed[0] else text
        if self._fault_cache is not None:
            return self._fault_cache
        text = _read_held(self._fault_fd).decode("utf-8", errors="replace")
        replaced = _replaced_by(self.fault_path, self._fault_fd)
        if replaced and text.strip():
            text += (f"\n(the fault file's name was taken over by {replaced} while the run went on: this is "
                     f"what the worker wrote to the file it opened)\n")
        if self.proc is not None and self.proc.poll() is not None:
            self._fault_cache = text
        return text

    def _wait(self) -> None:
        """When the worker exits, end its group: orphans would keep the pipes open."""
        assert self.proc is not None
        self.proc.wait()
        if hasattr(os, "killpg"):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError, OSError):
                pass
        if self.launcher is not None:  # a worker that outlived its launcher's command hears the end, as over ssh
            try:
                self.proc.stdin.close()
            except (OSError, ValueError):
                pass
        self._exited.set()

    def _chunks(self, fd: int):
        """Bytes read from ``fd`` until end of file, or until the worker has been gone a moment
        (a child that left the process group may still hold the pipe)."""
        gone_since = None
        while True:
            try:
                ready, _, _ = select.select([fd], [], [], 0.25)
            except (OSError, ValueError):
                return
            if not ready:
                if self._exited.is_set():
                    gone_since = gone_since or time.monotonic()
                    if time.monotonic() - gone_since > 1.0:
                        return
                continue
            try:
                chunk = os.read(fd, 1 << 20)
            except OSError:
                return
            if not chunk:
                return
            yield chunk

    def _read_protocol(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        # Lines, and compressed frames from a worker behind a launcher (core.protocol.wire).
        report = transfer_progress(self._deliver)

        def progress(header: dict, got: int, decoded: int) -> None:
            self.frame_at = time.monotonic()
            report(header, got, decoded)

        decoder = self._decoder = StreamDecoder(self._handle_line, progress, self.check)
        try:
            for chunk in read_ahead(self._chunks(self.proc.stdout.fileno())):
                self.feeding = True  # building what came counts as arriving (50,000 nodes take a while)
                decoder.feed(chunk)
                self.bytes_at, self.feeding = time.monotonic(), False
        except Exception as exc:  # noqa: BLE001 - whatever the bytes were, this reader must report the exit
            # Nothing after bytes that cannot be decoded can be read: the run ends now, saying why,
            # with what arrived before them, rather than waiting on a reader that is gone.
            self.feeding = False
            self.stream_error = (f"the worker's messages could not be read, so the run was ended: "
                                 f"{exc if isinstance(exc, ProtocolMismatch) else f'{type(exc).__name__}: {exc}'}")
            log.warning("worker %s: %s", self.id, self.stream_error)
            self.kill()
        self.cut_off = decoder.cut_off() if not self.stream_error else ""
        self._decoder = None  # nothing more arrives: a frame cut off here is not on its way
        decoder.close()
        if self.launcher is not None and not self._exited.wait(HANG_UP_GRACE):
            # The link's end of the stream closed (a dropped connection, a pipe cut on the way)
            # while the command runs on: behind a launcher there is no fallback file, so nothing
            # more can arrive. End it now rather than at the run's time limit.
            with self._lock:
                self.said_at_hang_up = self.output_tail.decode("utf-8", errors="replace")
            self.hung_up = True
            self.kill()
        self._exited.wait()
        code = self.proc.wait()
        # Messages the worker could not send on its channel (the script closed it).
        try:
            for raw in _read_held(self._fallback_fd).split(b"\n"):
                if raw.strip():
                    opened = self.check.line(raw) if self.check is not None else raw
                    if opened is not None:
                        self._handle_line(opened)
        except Exception:  # noqa: BLE001 - the exit below is reported whatever the file held
            log.exception("worker %s: its fallback file could not be read", self.id)
        # Let the output reader drain what the worker printed last.
        drained = self._output_done.wait(timeout=2)
        self.ready.set()
        self._deliver(events.Exit(code=code))
        with self._held_lock:
            self.finished.set()
            if self._unlinked:
                self._close_held()
        # The worker is gone: its pipes are closed now rather than whenever the garbage collector
        # gets to them (hundreds of runs and stops would otherwise pile up open descriptors).
        self._close_pipes(stderr=drained)

    def _close_pipes(self, stderr: bool = True) -> None:
        if self.proc is None:
            return
        pipes = [self.proc.stdin, self.proc.stdout] + ([self.proc.stderr] if stderr else [])
        for pipe in pipes:
            try:
                if pipe is not None:
                    pipe.close()
            except (OSError, ValueError):
                pass

    def _handle_line(self, raw: bytes | dict) -> None:
        if isinstance(raw, dict):  # a message core.protocol.wire decoded already (a trace sent in columns)
            data = raw
        elif not raw.strip():
            return
        else:
            try:
                if len(raw) > 1 << 20:  # a big trace: millions of small objects at once
                    with paused_gc():
                        data = json.loads(raw)
                else:
                    data = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                log.warning("worker %s sent a line that is not JSON", self.id)
                return
        if isinstance(data, dict) and data.get("type") == "hello":
            try:
                check_hello(data, f"the worker on {self.launcher.name}" if self.launcher else "the worker")
            except ProtocolMismatch as exc:
                self.refused = str(exc)
                self._deliver(events.Refused(message=self.refused))
                self.kill()
                return
        msg = typed(data)
        if isinstance(msg, events.BadMessage) and isinstance(data, dict) and data.get("type") == "hello":
            # A hello the app cannot read: refused, naming the field (not a 120 s wait for a ready worker).
            self.refused = f"the worker's hello cannot be read: {msg.error}"
            self._deliver(events.Refused(message=self.refused))
            self.kill()
            return
        if isinstance(msg, protocol.Hello):
            self.hello = msg
            self.ready.set()
        elif isinstance(msg, protocol.Fault):
            self.remote_fault = msg.text
            return
        elif isinstance(msg, protocol.Placed):  # where the travelling script was written on the worker's host
            self.placed = (msg.path, msg.local)
        elif isinstance(msg, protocol.Exiting):
            self.exiting = msg
        self._deliver(msg)

    def drain_output(self, limit: float = 0.25) -> None:
        """Wait (up to ``limit`` s) until the output reader has taken all the script wrote so far.

        The script's output and the protocol travel on two pipes: a line printed just before the
        script ended can still be in its pipe when the trace arrives."""
        if self.proc is None or self.proc.stderr is None or self._output_done.is_set():
            return
        try:
            fd = self.proc.stderr.fileno()
        except (OSError, ValueError):
            return
        deadline = time.monotonic() + limit
        quiet = 0
        while time.monotonic() < deadline and not self._output_done.is_set():
            try:
                pending = bool(select.select([fd], [], [], 0)[0])
            except (OSError, ValueError):
                return
            before = self.output_bytes
            time.sleep(0.005)
            quiet = quiet + 1 if not pending and self.output_bytes == before else 0
            if quiet >= 2:  # nothing in the pipe and nothing taken from it for two ticks
                return

    def _read_output(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for chunk in self._chunks(self.proc.stderr.fileno()):
            with self._lock:
                self.output_bytes += len(chunk)
                self.output_tail += chunk
                if len(self.output_tail) > OUTPUT_TAIL:
                    del self.output_tail[: len(self.output_tail) - OUTPUT_TAIL]
            self._deliver(events.Output(text=chunk.decode("utf-8", errors="replace")))
        self._output_done.set()
        if self.finished.is_set():  # the protocol reader finished first and left this pipe open
            try:
                self.proc.stderr.close()
            except (OSError, ValueError):
                pass

    def _deliver(self, msg) -> None:
        """Hand on a message (a dict is typed first: the client's own events, transfer progress)."""
        if isinstance(msg, dict):
            msg = typed(msg)
        msg.extra["worker"] = self.id
        try:
            self.on_message(msg)
        except Exception:
            log.exception("a worker message handler failed")


def typed(data) -> protocol._Base:
    """A received message as its protocol dataclass; one that does not fit becomes a ``BadMessage``
    naming the field and keeping the message as received (logged; the run goes on)."""
    try:
        return protocol.event_from_dict(data)
    except protocol.ProtocolError as exc:
        log.warning("a worker message does not match the protocol: %s", exc)
        return events.BadMessage(error=str(exc), raw=data)


def _private_temp(kind: str, suffix: str) -> tuple[Path | None, int | None]:
    """An empty file only this user can read, made with an unpredictable name and exclusive
    create, and the descriptor it was made with (held: read through it, what is at the name later
    does not matter)."""
    try:
        fd, name = tempfile.mkstemp(prefix=f"backprop-studio-{kind}-", suffix=suffix)
    except OSError:
        return None, None
    return Path(name), fd


def _read_held(fd: int | None) -> bytes:
    """What the file open on ``fd`` holds, from its start (``HELD_FILE_CAP`` at most)."""
    if fd is None:
        return b""
    parts, at = [], 0
    try:
        while at < HELD_FILE_CAP:
            part = os.pread(fd, min(1 << 20, HELD_FILE_CAP - at), at)
            if not part:
                break
            parts.append(part)
            at += len(part)
    except OSError:
        pass
    return b"".join(parts)


def _replaced_by(path: Path | None, fd: int | None) -> str:
    """What now stands at ``path`` in place of the file open on ``fd``, in words ("" when it is that file)."""
    if path is None or fd is None:
        return ""
    try:
        now, held = os.lstat(path), os.fstat(fd)
    except FileNotFoundError:
        return "nothing (it was removed)"
    except OSError:
        return ""
    if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
        return ""
    if stat.S_ISLNK(now.st_mode):
        return "a symbolic link"
    if stat.S_ISFIFO(now.st_mode):
        return "a FIFO"
    return "another file"
