"""Stand-in for a worker that has just finished a run: says hello, then sends one saved trace
through the worker's own Channel (compressed in frames when asked, as a worker behind a
launcher does; bench_remote.py starts it behind one). The time it starts encoding travels in
the ``started`` message. With ``timeline=FILE`` among its arguments it writes there, as JSON,
when it had encoded its first batch of columns (what goes first onto the link) and its last
column line."""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.protocol import messages as protocol
from core.model.trace import Trace  # noqa: E402
from core.model.trace_json import load_trace
from core.protocol.wire import PROTOCOL_VERSION, pick_codec  # noqa: E402
from core.worker.main import Channel  # noqa: E402


def as_the_worker_holds_it(trace: Trace) -> Trace:
    """``trace`` with each leaf's gradient preview the very object of its tensor's ``grad.values``,
    as the worker builds it (core.worker.capture.call_record); a trace read from a file holds equal copies."""
    for call in trace.calls:
        grads = {t.name: t.grad.values for t in call.tensors if t.name and t.grad is not None}
        for name, values in call.leaf_grads.items():
            if grads.get(name) == values:
                call.leaf_grads[name] = grads[name]
    return trace


def main() -> None:
    path, codec = sys.argv[1], sys.argv[2]
    trace = as_the_worker_holds_it(load_trace(path))
    channel = Channel(os.dup(1))
    setup = json.loads(sys.stdin.readline())  # the channel's set-up line: sealed, as the worker's messages are
    channel.seal_with(bytes.fromhex(setup["key"]))
    channel.send({"type": "hello", "pid": os.getpid(), "protocol": PROTOCOL_VERSION, "devices": []})
    cmd = json.loads(sys.stdin.readline())  # the run command
    channel.send({"type": "started", "run": cmd["run"], "t": time.time()})
    channel.codec = pick_codec(codec)
    channel.columns = "columns" in (cmd.get("encodings") or ()) and "json" not in sys.argv[3:]
    timeline = next((a.partition("=")[2] for a in sys.argv[3:] if a.startswith("timeline=")), None)
    stamps: dict = {}
    if timeline:
        from core.protocol import wire

        encode_lines = wire.encode_lines

        def stamped(obj):
            size = 0
            for line in encode_lines(obj):
                size += len(line)
                now = time.time()  # the line is encoded: the next step hands it on
                if size >= wire.COLUMNS_FIRST:
                    stamps.setdefault("first", now)  # the first batch is whole: it leaves for the link
                stamps["last"] = now
                yield line

        wire.encode_lines = stamped
    channel.send(protocol.TraceDone(trace=trace, run=cmd["run"]).to_dict())
    if timeline:
        stamps.setdefault("first", stamps["last"])
        Path(timeline).write_text(json.dumps(stamps))
    sys.stdin.readline()


if __name__ == "__main__":
    main()
