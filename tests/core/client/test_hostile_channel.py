"""Scripts that go for the worker's channel to the app: they write on its descriptor (found
through /proc/self/fd, as a hostile script would), into its fallback or fault file, or patch the
modules the channel uses. Nothing they write is shown as the run's, and every run ends in time."""

import json
import shlex
import sys
import textwrap
import threading
import time

import pytest

from core.client.handle import run_capture
from core.client.launchers import from_command
from core.client.process import ROOT
from core.model.trace_json import call_to_dict
from core.protocol import wire

# What a hostile script does to find the protocol descriptor: every pipe it may write to, past fd 2.
FIND_PIPES = '''
import os
def write_pipes():
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
            with open(f"/proc/self/fdinfo/{fd}") as f:
                flags = int(f.read().split("flags:")[1].split()[0], 8)
        except (OSError, IndexError, ValueError):
            continue
        if fd > 2 and link.startswith("pipe:") and flags & 3 == os.O_WRONLY:
            found.append(fd)
    return found
'''

PLAIN = "import torch\nx = torch.tensor(1.0, requires_grad=True)\n(x * 2).backward()\n"


def bounded(bound: float, **run_args):
    """``run_capture`` that must end within ``bound`` seconds: (result, seconds taken)."""
    box = {}

    def go():
        started = time.monotonic()
        box["result"] = run_capture(**run_args)
        box["took"] = time.monotonic() - started

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(bound)
    assert "result" in box, f"the run did not end within {bound:g} s"
    return box["result"], box["took"]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture(scope="module")
def forged_call(tmp_path_factory):
    """A real captured call of ``x * 2`` whose gradient is changed from 2 to 42: what a script
    that wants its own numbers shown would send."""
    script = tmp_path_factory.mktemp("genuine") / "plain.py"
    script.write_text(PLAIN)
    result = run_capture(str(script), timeout=60)
    assert result.trace.error is None and result.trace.calls[0].leaf_grads["x"].data == [2.0]
    trace = result.trace.to_dict()
    call = call_to_dict(result.trace.calls[0])
    call["leaf_grads"]["x"]["data"] = [42.0]
    for tensor in call["tensors"]:
        if tensor.get("grad"):
            tensor["grad"]["values"]["data"] = [42.0]
    return call, trace


def forged_messages(forged: tuple, script: str) -> str:
    """A call and a whole trace, each a well-formed line of the protocol, with grad 42."""
    call, trace = forged
    trace = {**trace, "calls": [call], "script": script}
    lines = [{"type": "call_trace", "run": 1, "position": 0, "call": call},
             {"type": "trace", "run": 1, "streamed": 0, "trace": trace}]
    return "".join(json.dumps(m) + "\n" for m in lines)


def assert_genuine(result, dropped: int):
    trace = result.trace
    assert trace.error is None, trace.error
    assert [c.leaf_grads["x"].data for c in trace.calls] == [[2.0]]
    assert [t.grad.values.data for t in trace.calls[0].tensors if t.grad is not None] == [[2.0]]
    warning = [m for m in result.bad_messages if "failed its check" in m]
    assert warning and warning[0].startswith(f"a message on the worker's channel failed its check: {dropped} dropped (")


@pytest.mark.slow
def test_a_trace_forged_on_the_descriptor_is_dropped_and_said(tmp_path, forged_call):
    """Before, the forged line was taken as the run's trace: x.grad showed 42, with no warning."""
    forged = tmp_path / "forged.jsonl"
    script = tmp_path / "forge.py"
    forged.write_text(forged_messages(forged_call, str(script)))
    script.write_text(FIND_PIPES + PLAIN + textwrap.dedent(f'''
        data = open({str(forged)!r}, "rb").read()
        fds = write_pipes()
        assert fds, "no pipe to write to"
        for fd in fds:
            os.write(fd, data)
        '''))
    result, _ = bounded(60, path=str(script), timeout=30)
    assert_genuine(result, dropped=2)
    assert result.bad_messages[-1].endswith("(a line without a seal); what is shown came from the worker")


@pytest.mark.slow
def test_a_trace_forged_in_the_fallback_file_is_dropped_and_said(tmp_path, forged_call, monkeypatch):
    """The script closes the descriptor (so the worker's messages go to its fallback file) and
    writes a forged trace into that file, found by its name in /proc/self/cmdline (before) or in
    the temporary folder. Before, the forged trace was the run's."""
    import tempfile

    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    forged = tmp_path / "forged.jsonl"
    script = tmp_path / "forge.py"
    forged.write_text(forged_messages(forged_call, str(script)))
    script.write_text(FIND_PIPES + textwrap.dedent(f'''
        import glob
        words = open("/proc/self/cmdline", "rb").read().decode().split("\\0")
        files = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--fallback-file"]
        files = files or glob.glob({str(private)!r} + "/backprop-studio-result-*")
        assert files, "no fallback file found"
        for fd in write_pipes():
            os.close(fd)
        ''') + PLAIN + textwrap.dedent(f'''
        for path in files:
            with open(path, "ab") as f:
                f.write(open({str(forged)!r}, "rb").read())
        '''))
    result, _ = bounded(60, path=str(script), timeout=30)
    assert_genuine(result, dropped=2)


@pytest.mark.slow
def test_a_bad_frame_header_written_on_the_descriptor_ends_nothing(tmp_path):
    """Before, the reader thread raised on it and the run never ended (--timeout 20 still ran at
    150 s). Now the line fails its check: dropped and named, and the run goes on to its trace."""
    script = write(tmp_path, "bad_frame.py", FIND_PIPES + PLAIN + textwrap.dedent('''
        for fd in write_pipes():
            os.write(fd, b'{"type": "frame", bad header\\n')
        (x * 3).backward()
        '''))
    result, took = bounded(35, path=str(script), timeout=20)
    assert result.trace.error is None, result.trace.error
    assert [c.leaf_grads["x"].data for c in result.trace.calls] == [[2.0], [5.0]]
    assert result.bad_messages == ["a message on the worker's channel failed its check: 1 dropped (a line without "
                                   "a seal); what is shown came from the worker"]
    assert took < 20


def test_the_seal_refuses_a_changed_replayed_or_reordered_line():
    key = wire.new_key()
    seal_line, _ = wire.sealer(key)
    first, second = seal_line(b'{"type": "call", "index": 0}\n'), seal_line(b'{"type": "call", "index": 1}\n')
    check = wire.Check(key)
    assert check.line(first.rstrip(b"\n")) == b'{"type": "call", "index": 0}'
    assert check.line(first.rstrip(b"\n")) is None  # sent again
    changed = second.replace(b'"index": 1', b'"index": 7')
    assert check.line(changed.rstrip(b"\n")) is None
    assert check.line(second.rstrip(b"\n")) == b'{"type": "call", "index": 1}'
    other = wire.Check(wire.new_key())
    assert other.line(first.rstrip(b"\n")) is None  # another worker's key
    assert check.dropped == {"a line sent again or out of order": 1, "a line whose seal does not match": 1}
    for _ in range(3):
        assert check.line(b"\t1 " + b"0" * 64) is None
    assert check.line(b"") == b""  # a blank line is no message: not counted
    assert check.summary() == ("a message on the worker's channel failed its check: 5 dropped (a line sent again or "
                               "out of order; a line whose seal does not match); what is shown came from the worker")
    reordered = wire.Check(key)
    assert reordered.line(second.rstrip(b"\n")) is not None
    assert reordered.line(first.rstrip(b"\n")) is None


def test_a_sealed_frame_whose_body_was_changed_is_dropped():
    key = wire.new_key()
    seal_line, seal_frame = wire.sealer(key)
    raw = json.dumps({"type": "trace", "run": 1, "pad": "x" * 5000}).encode()
    header, body = seal_frame(wire.header_line(wire.frame_header("trace", len(raw), "zlib")))
    chunks = b"".join(body(c) for c in wire.frame_chunks(raw, "zlib")) + body(None)
    after = seal_line(b'{"type": "bye"}')
    for stream, expected in ((header + chunks + after, [raw, b'{"type": "bye"}']),
                             (header + chunks[:-1] + b"!" + after, [b'{"type": "bye"}'])):
        got = []
        check = wire.Check(key)
        wire.StreamDecoder(got.append, check=check).feed(stream)
        assert got == expected
        assert check.dropped == ({} if len(expected) == 2 else {"a frame whose seal does not match": 1})


FAKE_WORKER = '''
import json, os, sys
out = os.fdopen(1, "wb", buffering=0)
sys.stdin.readline()  # the channel's set-up line: this worker does not seal
out.write(json.dumps({{"type": "hello", "pid": os.getpid(), "protocol": {protocol}, "devices": []}}).encode() + b"\\n")
run = json.loads(sys.stdin.readline())["run"]
call = json.load(open({call!r}))
out.write(json.dumps({{"type": "started", "run": run, "t": 0}}).encode() + b"\\n")
out.write(json.dumps({{"type": "call_trace", "run": run, "position": 0, "call": call}}).encode() + b"\\n")
out.write({bad!r})
sys.stdin.read()
'''


@pytest.mark.slow
@pytest.mark.parametrize("bad, named", [
    (b'{"type": "frame", "codec": "zlib", "raw": 10, "of": trace}\n',
     "the worker sent a frame header that is not JSON (Expecting value: line 1 column 53 (char 52)): "
     "b'{\"type\": \"frame\", \"codec\": \"zlib\", \"raw\": 10, \"of\": trace}'"),
    (b'{"type": "frame", "codec": "lz4", "raw": 10, "of": "trace"}\n',
     "the worker sent a frame in an unknown codec 'lz4'"),
], ids=["header-not-json", "unknown-codec"])
def test_bytes_that_cannot_be_decoded_end_the_run_at_once_naming_them(tmp_path, forged_call, bad, named):
    """Before, the reader thread raised and no exit was ever reported: a run with a 20 s limit
    still ran after 110 s. Now it ends at once, saying what was wrong, with the call that came first."""
    (tmp_path / "call.json").write_text(json.dumps(forged_call[0]))
    fake = write(tmp_path, "fake_worker.py", FAKE_WORKER.format(protocol=wire.PROTOCOL_VERSION, bad=bad,
                                                                call=str(tmp_path / "call.json")))
    launcher = from_command(f"{shlex.quote(sys.executable)} {shlex.quote(str(fake))}", name="fake")
    script = write(tmp_path, "s.py", "x = 1\n")
    result, took = bounded(35, path=str(script), launcher=launcher, timeout=20)
    err = result.trace.error
    assert err.type == "ChannelError" and err.kind == "disconnected"
    assert err.message.startswith(f"the worker's messages could not be read, so the run was ended: {named}")
    assert [c.leaf_grads["x"].data for c in result.trace.calls] == [[42.0]]  # what came before is kept
    assert took < 15


@pytest.mark.slow
def test_a_worker_command_that_never_says_hello_ends_in_time_saying_so(tmp_path):
    """``--worker-command "sleep 400" --timeout 10``: before, the run ended after 134 s as a time-out
    of a started run; now after the limit and a few seconds, as a worker that never said hello."""
    script = write(tmp_path, "s.py", PLAIN)
    result, took = bounded(40, path=str(script), launcher=from_command("sleep 400"), timeout=10)
    err = result.trace.error
    assert (err.type, err.kind) == ("WorkerNotStarted", "load")
    assert err.message.startswith("the worker on sleep never started: nothing said hello within 20 s of the "
                                  "run's start (the command sleep (sleep 400) ran")
    assert took < 28


@pytest.mark.slow
@pytest.mark.parametrize("patch", [
    "import json, functools; json.dumps = functools.partial(json.dumps, indent=2)",
    "import json; json.JSONEncoder.encode = lambda self, o: 'nothing'",
    "import os; os.write = lambda fd, data: len(data)",
], ids=["json.dumps", "JSONEncoder", "os.write"])
def test_a_script_that_patches_what_the_channel_uses_changes_nothing_sent(tmp_path, patch):
    """Before, the run stalled to its time limit and lost its calls; plain python runs it in under 1 s."""
    script = write(tmp_path, "patch.py", patch + "\n" + PLAIN + "(x * 3).backward()\n")
    result, took = bounded(45, path=str(script), timeout=60)
    trace = result.trace
    assert trace.error is None, trace.error
    assert [c.leaf_grads["x"].data for c in trace.calls] == [[2.0], [5.0]]
    assert result.bad_messages == []
    assert took < 30


FAULT_FILE = '''
import os
def fault_file():
    for name in os.listdir("/proc/self/fd"):
        try:
            path = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if "backprop-studio-fault-" in path:
            return path
    raise SystemExit("no fault file found")
path = fault_file()
os.unlink(path)
'''


@pytest.mark.slow
@pytest.mark.parametrize("replace", ["os.symlink(SECRET, path)", "os.mkfifo(path)"], ids=["symlink", "fifo"])
def test_a_fault_file_the_script_replaced_is_neither_shown_nor_waited_on(tmp_path, replace):
    """The script puts a symbolic link (to a file of the user's) or a FIFO where its fault file
    was, then crashes. Before, the link's target was shown as the crash dump, and a FIFO kept the
    reader waiting forever. Now the dump the worker wrote is shown, and the run ends at once."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET\n")
    script = write(tmp_path, "crash.py", f"SECRET = {str(secret)!r}\n" + FAULT_FILE + replace + "\n"
                   "import faulthandler\nfaulthandler._sigsegv()\n")
    line = script.read_text().splitlines().index("faulthandler._sigsegv()") + 1
    result, took = bounded(45, path=str(script), timeout=30)
    err = result.trace.error
    assert (err.type, err.kind) == ("WorkerDied", "crash")
    assert "TOP SECRET" not in err.fault
    assert "Fatal Python error: Segmentation fault" in err.fault and err.line == line
    kind = "a symbolic link" if "symlink" in replace else "a FIFO"
    assert err.fault.endswith(f"(the fault file's name was taken over by {kind} while the run went on: this is "
                              f"what the worker wrote to the file it opened)")
    assert took < 30
