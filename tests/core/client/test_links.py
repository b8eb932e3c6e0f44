"""Links between the app and a worker behind a launcher: repeated calls travel as summaries, a link
cut or closed midway says what was lost, a frame's wait ends when its bytes stop coming."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch

from core.client import launchers
from core.protocol import wire
from core.client.handle import run_capture
from core.client.process import ROOT
from core.model.memory import format_bytes
from core.client.launchers import from_command
from tests.core.client.test_launchers import (  # noqa: F401  (the launcher and sshd fixtures)
    PY, assert_no_process, launcher, local_launcher, sshd, write)


LOOP = """import torch
from torch import nn
torch.manual_seed(0)
blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(100))
x = torch.randn(4, 8)
for step in range(6):
    h = x
    for block in blocks:
        h = h + torch.relu(block(h))
    h.pow(2).mean().backward()
"""


def _loop_grad() -> list:
    """blocks.0's weight gradient after LOOP's six calls (each adds the same one), by torch.autograd.grad."""
    scope: dict = {}
    exec(LOOP.split("for step")[0], scope)  # the same seed, blocks and input
    h = scope["x"]
    for block in scope["blocks"]:
        h = h + torch.relu(block(h))
    (g,) = torch.autograd.grad(h.pow(2).mean(), scope["blocks"][0].weight)
    return (6 * g).reshape(-1).tolist()


def through_link(link: Path, args: str, name: str, mark: str) -> launchers.Launcher:
    """A worker whose messages pass the Python program ``link`` (run with ``args``) on their way
    to the app: ``sh -c 'worker | link'``."""
    worker = f"cd {shlex.quote(str(ROOT))} && {shlex.quote(PY)} -m core.worker | " \
             f"{shlex.quote(PY)} {shlex.quote(str(link))} {args}"
    return from_command(f"sh -c {shlex.quote(worker)}", name=name, compress="zlib", env={"BPS_TEST_MARK": mark})


@pytest.mark.slow
@pytest.mark.parametrize("ending", ["", "crash", "spin", "spin behind a launcher", "spin behind a slow link"])
def test_a_loops_repeated_calls_travel_as_summaries(tmp_path, ending):
    """A loop's calls past the first three are kept as summaries, but the last is kept in full:
    it is streamed as its summary (the full call would be dropped as soon as another came), and
    comes in full with the trace at the end. Over a slow link that is four graphs sent instead
    of one per step. A crash after the loop keeps the summary; a run the app ends at its time
    limit gets the last call whole when the app asks for the stacks."""
    crash, spin = ending == "crash", ending.startswith("spin")
    text = LOOP + ("import ctypes\nctypes.string_at(0)\n" if crash else "while True:\n    pass\n" if spin else "")
    mark = uuid.uuid4().hex
    events = []
    launcher = local_launcher(mark) if "launcher" in ending else \
        through_link(ROOT / "bench/slow_link.py", "100000", "slow", mark) if "slow" in ending \
        else None  # the last call, 63 KB in zlib, takes 0.6 s on that link: the app waits for it
    result = run_capture(str(write(tmp_path, "loop.py", text)), timeout=15 if spin else 120, on_event=events.append,
                         launcher=launcher)
    # The end of each frame, and of those the whole graphs (about 185 KB of columns each; a summary's
    # are about 55 KB in columns: their leaf grads and the gradient norms of the 200 parameters).
    ends = [e for e in events if e.get("type") == "transfer" and e["decoded"] == e["raw"]]
    whole = ["call_trace"] * 4 if spin else ["call_trace"] * 3 + ([] if crash else ["trace"])
    assert [e["of"] for e in ends if e["raw"] > 120_000] == whole
    assert [e["of"] for e in ends if e["raw"] < 80_000] == ["call_trace"] * 3  # the summaries
    calls = result.trace.calls
    assert [c.snapshot for c in calls] == ["full"] * 3 + ["summary"] * (3 if crash else 2) + ([] if crash else ["full"])
    assert all(c.node_count == 602 and c.same_as == "c0" for c in calls[1:])
    last = calls[5]
    want = _loop_grad()
    assert len(last.leaf_grads) == 200

    def matches(values) -> bool:  # a preview: the first 8 of the 64 values, and their extremes
        return values.sample == pytest.approx(want[:8], rel=1e-5, abs=1e-9) and values.numel == 64 and \
            (values.min, values.max) == pytest.approx((min(want), max(want)), rel=1e-5)

    assert matches(last.leaf_grads["blocks.0.weight"])
    if crash:
        assert (result.trace.error.kind, result.trace.error.line) == ("crash", 12)
    elif spin:  # the stacks came first, and name the line the script was at
        assert (result.trace.error.kind, result.trace.error.line) in (("timeout", 11), ("timeout", 12))
    else:
        assert result.trace.error is None
    if not crash:
        assert len(last.nodes) == 602
        assert matches(next(t for t in last.tensors if t.name == "blocks.0.weight").grad.values)
    assert_no_process(mark)


def cut_link(spawn: bool) -> str:
    """A link process that passes the worker's messages on until a captured call's frame has
    begun, then that frame's header, first chunk and 100 bytes more. ``spawn``: it starts the
    worker itself (stdin and stderr are the link's), then carries nothing more while it keeps
    running: a connection gone dead. Otherwise it reads the worker's stdout on its stdin and
    exits: a link that closed its end."""
    head = ("import os, subprocess, sys, time\n"
            "worker = subprocess.Popen([sys.executable, '-m', 'core.worker'], stdout=subprocess.PIPE)\n"
            "src = worker.stdout.fileno()\n") if spawn else "import os\nsrc = 0\n"
    return head + ("buf, sent, end = b'', 0, None\n"
                   "while True:\n"
                   "    d = os.read(src, 65536)\n"
                   "    if not d: break\n"
                   "    buf += d\n"
                   "    at = buf.find(b'\"of\": \"call_trace\"')\n"
                   "    nl = buf.find(b'\\n', at) if at >= 0 else -1\n"
                   "    if nl >= 0 and len(buf) >= nl + 5:\n"
                   "        end = nl + 5 + int.from_bytes(buf[nl + 1:nl + 5], 'big') + 100\n"
                   "    if end is not None and len(buf) >= end:\n"
                   "        os.write(1, buf[sent:end]); break\n"
                   "    if at < 0:\n"
                   "        os.write(1, buf[sent:]); sent = len(buf)\n") + \
        ("os.close(1)\ntime.sleep(300)\n" if spawn else "os._exit(0)\n")


CHAIN = ("import torch\nx = torch.randn(64, requires_grad=True)\ny = x\n"
         "for _ in range(300):\n    y = torch.tanh(y) * 1.01\ny.sum().backward()\nprint('done', flush=True)\n")


CUT_CALL = r"; a captured call was cut off: \d+(\.\d)? (B|KB) of it had arrived \(about \d+%\), and it is lost"


@pytest.mark.slow
def test_a_link_cut_in_the_middle_of_a_trace_says_what_was_lost(tmp_path):
    """The link goes dead while a captured call travels, its command still running: the app ends
    it within seconds instead of at the time limit, and the error says the worker's messages
    stopped, which message was cut off, how much of it had come, and that it is lost; nothing
    is left running."""
    mark = uuid.uuid4().hex
    link = write(tmp_path, "cut_link.py", cut_link(spawn=True))
    launcher = from_command(f"{shlex.quote(PY)} {shlex.quote(str(link))}", name="cut", compress="zlib",
                            env={"BPS_TEST_MARK": mark})
    result = run_capture(str(write(tmp_path, "chain.py", CHAIN)), launcher=launcher, timeout=100)
    err = result.trace.error
    assert result.trace.calls == []  # the one call was in the frame cut off
    assert (err.type, err.kind) == ("ConnectionLost", "disconnected"), err
    assert re.fullmatch(rf"the worker's messages from cut stopped before the run finished, while "
                        rf"{re.escape(os.path.basename(PY))} still ran \(the link dropped, or the script closed the "
                        rf"worker's pipe\); the app ended it{CUT_CALL}", err.message), err
    assert result.elapsed < 60  # not the time limit of 100 s
    assert_no_process(mark)


@pytest.mark.slow
def test_a_link_that_closes_its_end_midway_ends_the_run_and_says_so(tmp_path):
    """The link on the way exits in the middle of a captured call: the worker's next message finds
    its pipe's far end closed, so the worker ends the run and says which end closed (not that the
    script closed it); the app names the call cut off; nothing is left running."""
    mark = uuid.uuid4().hex
    launcher = through_link(write(tmp_path, "cut_link.py", cut_link(spawn=False)), "", "cut", mark)
    result = run_capture(str(write(tmp_path, "chain.py", CHAIN)), launcher=launcher, timeout=100)
    err = result.trace.error
    assert result.trace.calls == []
    assert (err.type, err.kind) == ("ConnectionLost", "disconnected"), err
    assert re.fullmatch(r"the link from cut closed its end of the worker's pipe before the run finished, so nothing "
                        rf"more could come back: the worker ended the run{CUT_CALL}", err.message), err
    assert result.elapsed < 60
    assert_no_process(mark)


def test_frames_stream_in_chunks_and_report_progress():
    import json as _json

    msg = {"type": "trace", "trace": {"calls": [{"id": f"c{i}", "nodes": list(range(200))} for i in range(3000)]}}
    raw = _json.dumps(msg, separators=(",", ":")).encode()
    for codec in wire.available_codecs():
        header = (_json.dumps(wire.frame_header("trace", len(raw), codec)) + "\n").encode()
        body = b"".join(wire.frame_chunks(raw, codec))
        assert len(body) < len(raw) / 5
        stream = b'{"type":"call","index":0}\n' + header + body + b'{"type":"bye"}\n'
        lines, seen = [], []
        decoder = wire.StreamDecoder(lines.append, lambda h, got, dec: seen.append((h["of"], got, dec)))
        for at in range(0, len(stream), 7777):  # arbitrary cuts, as a pipe delivers them
            decoder.feed(stream[at:at + 7777])
        assert lines == [b'{"type":"call","index":0}', raw, b'{"type":"bye"}']
        assert len(seen) >= 2 and seen[-1] == ("trace", len(body), len(raw))  # progress to the end
        assert decoder.cut_off() == ""  # it ended between messages
        last = []
        cut = wire.StreamDecoder(lines.append, lambda h, got, dec: last.append((got, dec)))
        cut.feed(header + body[:-6])  # the last chunk and the end mark missing
        assert cut.partial  # a connection closed mid-frame is noticed, and said in words
        got, dec = last[-1] if last else (0, 0)
        share = f" (about {100 * dec // len(raw)}%)" if dec else ""  # none decoded: no share to tell
        assert dec < len(raw) and got > 0
        assert cut.cut_off() == f"the trace was cut off: {format_bytes(got)} of it had arrived{share}, and it is lost"
    with pytest.raises(wire.ProtocolMismatch, match="unknown codec 'lz4'"):
        wire.StreamDecoder(print).feed(b'{"type": "frame", "codec": "lz4", "raw": 1}\n')


@pytest.mark.slow
def test_the_wait_for_a_frame_ends_when_its_bytes_stop_coming():
    """Before ending a run the app waits while a frame arrives (a loop's last call on a slow link),
    but not for a frame the worker stopped in the middle of: it waits while bytes keep coming
    (here 1.2 s of them), then ``stall`` s more, well short of the cap."""
    from core.client.process import WorkerProcess

    w = WorkerProcess(lambda msg: None)
    w.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        decoder = wire.StreamDecoder(lambda msg: None)
        decoder.feed((json.dumps(wire.frame_header("call_trace", 10_000_000, "zlib")) + "\n").encode())
        assert decoder.partial
        w._decoder = decoder
        for trickle in (0.0, 1.2):
            def arriving(until=time.monotonic() + trickle):
                while time.monotonic() < until:
                    w.bytes_at = time.monotonic()
                    time.sleep(0.05)

            feeder = threading.Thread(target=arriving)
            feeder.start()
            began = time.monotonic()
            w._let_frames_arrive(start=0.3, cap=30.0, stall=0.5)
            waited = time.monotonic() - began
            feeder.join()
            assert trickle + 0.4 <= waited < trickle + 5.0, (trickle, waited)
            w.feeding = True  # the decoder building what came also counts as arriving
            timer = threading.Timer(1.0, lambda: setattr(w, "feeding", False))
            timer.start()
            began = time.monotonic()
            w._let_frames_arrive(start=0.3, cap=30.0, stall=0.5)
            assert time.monotonic() - began >= 1.0
            timer.join()
    finally:
        w.proc.kill()
        w.proc.wait()
