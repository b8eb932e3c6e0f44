"""Columnar frames on the wire: decoded as they stream in, big tables in blocks built as they
come, the codec both ends agree on (zstd where both have it), and the worker channel's writer
thread, Stop and read-ahead around them."""

import gc
import json
import os
import shlex
import sys
import threading
import time
from dataclasses import replace

import pytest

from core.client.handle import run_capture
from core.client.launchers import from_command
from core.client.process import ROOT
from core.model.trace import Saved, Trace, TraceFormatError
from core.model.trace_json import call_from_dict, trace_from_dict
from core.protocol import column_reader as tr
from core.protocol import columns as tc
from core.protocol import wire
from core.worker.channel import Channel
from tests.core.protocol.column_data import call_with_leaf_grads, column_items, full_trace, item_index, joined
from tests.fixtures_graphs import residual_mlp_call

try:
    import zstandard
except ImportError:  # the zstd cases skip; zlib is always there
    zstandard = None


def _stream(obj, codec: str, piece: int = 997) -> tuple[list, list]:
    """A message holding ``obj`` sent as a columnar frame and fed to a StreamDecoder in small pieces."""
    key = "trace" if isinstance(obj, Trace) else "call"
    msg = {"type": "trace" if key == "trace" else "call_trace", key: obj, "run": 7, "position": 2}
    data = b'{"type": "hello"}\n' + b"".join(wire.columns_frame(msg, key, codec)) + b'{"type": "after"}\n'
    got, progress = [], []
    decoder = wire.StreamDecoder(got.append, lambda h, r, d: progress.append((h, r, d)))
    for at in range(0, len(data), piece):
        decoder.feed(data[at:at + piece])
    assert not decoder.partial
    return got, progress


@pytest.mark.parametrize("codec", ["zlib", "zstd", "raw"])
def test_a_columnar_frame_is_decoded_as_it_streams_in(codec, monkeypatch):
    if codec == "zstd" and wire._zstd() is None:
        pytest.skip("zstandard is not installed")
    monkeypatch.setattr(wire, "COLUMNS_FIRST", 4 * 1024)  # a chunk per few KiB of columns: several here
    monkeypatch.setattr(wire, "COLUMNS_BATCH", 8 * 1024)
    call = residual_mlp_call(blocks=200)
    got, progress = _stream(call, codec)
    assert got[0] == b'{"type": "hello"}' and got[2] == b'{"type": "after"}'
    msg = got[1]
    assert msg["type"] == "call_trace" and msg["run"] == 7 and msg["position"] == 2
    assert msg["call"] == call and call_from_dict(msg["call"]) is msg["call"]
    header, received, decoded = progress[-1]
    assert header["codec"] == codec and header["enc"] == "columns" and decoded == header["raw"]
    if codec == "raw":  # as they are: each chunk's bytes and its 4-byte length
        assert decoded < received < decoded + 4 * (len(progress) + 1)
    else:
        assert received * 3 < decoded  # compressed on the way
    assert len(got) == 3 and len(progress) > 5  # reported chunk by chunk, not only at the end
    assert [d for _, _, d in progress] == sorted(d for _, _, d in progress)
    with pytest.raises(TraceFormatError, match="the call_trace from the worker: a column is not readable JSON"):
        call_from_dict(_stream_broken(call, codec))


def _stream_broken(call, codec):
    """The same frame with one column's JSON corrupted: the error arrives in place of the call."""
    header = next(wire.columns_frame({"type": "call_trace", "call": call}, "call", codec))
    lines = tc.encode(call).splitlines(keepends=True)
    lines[3] = lines[3][:-5] + b"\n"  # a column cut off
    comp = wire.Packer(codec)
    out = comp.cut(b"".join(lines)) + comp.end()
    data = header + len(out).to_bytes(4, "big") + out + (0).to_bytes(4, "big")
    got = []
    wire.StreamDecoder(got.append).feed(data)
    return got[0]["call"]


def test_a_trace_frame_carries_the_whole_trace():
    trace = full_trace()
    got, _ = _stream(trace, "zlib", piece=64)
    assert got[1]["trace"] == trace and trace_from_dict(got[1]["trace"]) is got[1]["trace"]
    # Objects with nothing to encode (no worker asked for columns) still go as the trace format's JSON.
    plain = wire.plain_message({"type": "trace", "trace": trace, "run": 1})
    assert plain["trace"] == json.loads(trace.to_json()) and plain["run"] == 1


def test_zstd_falls_back_to_zlib_where_it_is_not_installed(monkeypatch):
    monkeypatch.setattr(wire, "_zstd", lambda: None)
    assert wire.available_codecs() == ["zlib"]
    assert wire.pick_codec("zstd") == "zlib" and wire.pick_codec("none") is None
    with pytest.raises(wire.ProtocolMismatch, match="pip install zstandard"):
        wire.decompressor("zstd")


BLOCK_ZSTD = """\
import runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("zstandard", "compression"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
sys.meta_path.insert(0, Block())
runpy.run_module("core.worker.main", run_name="__main__", alter_sys=True)
"""

SCRIPT = """\
import torch
x = torch.ones(3, requires_grad=True)
y = x
for _ in range(700):
    y = y * 1.0
y.sum().backward()
"""


@pytest.mark.slow
@pytest.mark.skipif(zstandard is None, reason="zstandard is not installed")
@pytest.mark.parametrize("worker_has_zstd", [True, False])
def test_the_trace_travels_in_zstd_where_both_ends_have_it_else_zlib(tmp_path, worker_has_zstd):
    """A worker behind a launcher, asked for zstd: the call comes back in zstd when the worker has
    it, in zlib when it has not (its hello says so), in columns either way, with the same grads."""
    script = tmp_path / "chain.py"
    script.write_text(SCRIPT)
    if worker_has_zstd:
        start = f"{shlex.quote(sys.executable)} -m core.worker"
    else:
        (tmp_path / "start_worker.py").write_text(BLOCK_ZSTD)
        start = f"{shlex.quote(sys.executable)} {shlex.quote(str(tmp_path / 'start_worker.py'))}"
    launcher = from_command(f"sh -c 'cd {shlex.quote(str(ROOT))} && PYTHONPATH=. exec {start}'", name="box",
                            compress="zstd")
    events = []
    result = run_capture(str(script), launcher=launcher, timeout=120, on_event=events.append)
    assert result.trace.error is None, (result.trace.error, result.output)
    (hello,) = [e for e in events if e.get("type") == "hello"]
    assert hello["codecs"] == (["zstd", "zlib"] if worker_has_zstd else ["zlib"])
    transfers = [e for e in events if e.get("type") == "transfer" and e["of"] == "call_trace"]
    assert transfers and {e["codec"] for e in transfers} == {"zstd" if worker_has_zstd else "zlib"}
    assert transfers[-1]["received"] < transfers[-1]["decoded"] == transfers[-1]["raw"]
    call = result.trace.calls[0]
    assert call.node_count == 702 and call.leaf_grads["x"].data == [1.0, 1.0, 1.0]


@pytest.mark.slow
def test_a_local_worker_sends_its_trace_in_uncompressed_columns(tmp_path):
    """No launcher: the run command asks for raw frames, so the call and the trace travel in
    columns through the pipe, uncompressed, and come back with the same grads."""
    script = tmp_path / "chain.py"
    script.write_text(SCRIPT)
    events = []
    result = run_capture(str(script), timeout=120, on_event=events.append)
    assert result.trace.error is None, (result.trace.error, result.output)
    transfers = [e for e in events if e.get("type") == "transfer"]
    assert {e["of"] for e in transfers} == {"call_trace", "trace"} and {e["codec"] for e in transfers} == {"raw"}
    call = [e for e in transfers if e["of"] == "call_trace"][-1]
    assert call["decoded"] == call["raw"] < call["received"]  # each chunk as it is, after its length
    (captured,) = result.trace.calls
    assert captured.node_count == 702 and captured.leaf_grads["x"].data == [1.0, 1.0, 1.0]


def test_a_big_frame_leaves_its_objects_out_of_later_collections(monkeypatch):
    monkeypatch.setattr(wire, "FREEZE_MIN_BYTES", 1)
    gc.unfreeze()
    enabled = gc.isenabled()
    try:
        got, _ = _stream(residual_mlp_call(blocks=50), "zlib", piece=4096)
        assert got[1]["call"] == residual_mlp_call(blocks=50)
        assert gc.get_freeze_count() > 1000 and gc.isenabled() == enabled
    finally:
        gc.unfreeze()


def test_the_worker_channel_compresses_columns_on_its_writer_thread():
    """The worker's own Channel: columns encoded on the sending thread, compressed and written on
    the writer thread, decoded by the app's StreamDecoder into the same trace."""
    read_fd, write_fd = os.pipe()
    trace = full_trace()
    channel = Channel(write_fd)
    channel.codec, channel.columns = "zlib", True
    out = bytearray()
    reader = threading.Thread(target=lambda: [out.extend(b) for b in iter(lambda: os.read(read_fd, 65536), b"")])
    reader.start()
    channel.send({"type": "trace", "trace": trace, "run": 3})
    os.close(write_fd)
    reader.join(30)
    os.close(read_fd)
    got = []
    wire.StreamDecoder(got.append).feed(bytes(out))
    assert got[0]["trace"] == trace and got[0]["run"] == 3 and not channel.broken
    assert out.count(b'"enc": "columns"') == 1 and len(out) < len(trace.to_json()) / 3


def _send_read(channel: Channel, read_fd: int, msg: dict) -> tuple[list, "wire.StreamDecoder", BaseException | None]:
    """Send ``msg`` on ``channel`` (whose pipe ``read_fd`` reads) and decode what came."""
    out = bytearray()
    reader = threading.Thread(target=lambda: [out.extend(b) for b in iter(lambda: os.read(read_fd, 65536), b"")])
    reader.start()
    raised = None
    try:
        channel.send(msg)
    except BaseException as exc:  # KeyboardInterrupt, here
        raised = exc
    channel.send({"type": "bye"})
    os.close(channel.fd)
    reader.join(30)
    os.close(read_fd)
    got = []
    decoder = wire.StreamDecoder(lambda m: got.append(m if isinstance(m, dict) else json.loads(m)))
    decoder.feed(bytes(out))
    return got, decoder, raised


def test_a_stop_that_comes_while_a_frame_is_made_waits_until_it_has_left(monkeypatch, sigint_gate):
    """Stop (``interrupt_main`` from the worker's command thread) lands while the script's thread
    encodes a call as a frame: the frame leaves whole, the next message after it, and the script
    gets its KeyboardInterrupt right after the send; once the script has ended the Stop is
    dropped. Before, the frame was cut where the interrupt landed, and the app waited for the
    rest of it."""
    import _thread

    from core.worker import channel as worker_channel

    gate = sigint_gate
    monkeypatch.setattr(worker_channel, "INTERRUPTS", gate)
    parts = wire.columns_parts

    def stopped_on_the_way(*args):
        for i, part in enumerate(parts(*args)):
            if i == 1:
                _thread.interrupt_main()  # what Cancel does, after the frame's header has gone
            yield part

    monkeypatch.setattr(wire, "columns_parts", stopped_on_the_way)
    call = residual_mlp_call(blocks=20)
    for active, expected in ((True, KeyboardInterrupt), (False, None)):
        gate.active = active  # the script runs / the script has ended
        read_fd, write_fd = os.pipe()
        channel = Channel(write_fd)
        channel.codec, channel.columns = "zlib", True
        got, decoder, raised = _send_read(channel, read_fd, {"type": "call_trace", "call": call, "position": 0})
        assert type(raised) is (expected or type(None))
        assert [m["type"] for m in got] == ["call_trace", "bye"] and got[0]["call"] == call
        assert not decoder.partial and gate.depth == 0 and not gate.pending


def test_a_channel_without_a_fallback_says_once_that_its_pipe_is_gone(tmp_path):
    """Behind a launcher (no fallback file) a pipe the script closed calls ``on_lost(True)`` once,
    on the first message that cannot go, small or framed; a pipe whose reader went away calls
    ``on_lost(False)``; with a fallback file the message goes there and nothing is called."""
    lost = []
    read_fd, write_fd = os.pipe()
    channel = Channel(write_fd)
    channel.codec, channel.on_lost = "zlib", lambda by_script: lost.append(("script", by_script))
    channel.send({"type": "call", "index": 0})
    assert os.read(read_fd, 100) == b'{"type":"call","index":0}\n' and lost == []
    os.close(write_fd)  # what the script did
    channel.send({"type": "memory", "samples": []})
    channel.send({"type": "trace", "trace": full_trace(), "run": 1})  # a frame, after the pipe is gone
    assert channel.broken and lost == [("script", True)]
    os.close(read_fd)
    read_fd, write_fd = os.pipe()  # the reader goes away: the descriptor is still the channel's pipe
    gone = Channel(write_fd)
    gone.on_lost = lambda by_script: lost.append(("reader", by_script))
    os.close(read_fd)
    gone.send({"type": "memory", "samples": []})
    assert gone.broken and lost[1:] == [("reader", False)]
    os.close(write_fd)
    lost.clear()
    fallback = tmp_path / "result.jsonl"
    fallback.write_bytes(b"")
    read_fd, write_fd = os.pipe()
    kept = Channel(write_fd, fallback=str(fallback))
    kept.on_lost = lambda by_script: lost.append(("kept", by_script))
    os.close(write_fd)
    kept.send({"type": "bye"})
    assert lost == [] and fallback.read_bytes() == b'{"type":"bye"}\n'
    os.close(read_fd)


def test_read_ahead_keeps_reading_while_the_caller_decodes():
    """The pipe is drained on a thread of its own: every piece arrives in order, the source runs
    ahead of a slow consumer, and an error in the source reaches the consumer."""
    made = []

    def source():
        for i in range(50):
            made.append(i)
            yield bytes([i])

    seen = []
    for chunk in wire.read_ahead(source()):
        if not seen:
            deadline = time.monotonic() + 5
            while len(made) < 50 and time.monotonic() < deadline:  # the consumer is busy: reading goes on
                time.sleep(0.01)
            assert len(made) == 50
        seen.append(chunk[0])
    assert seen == list(range(50))

    def broken():
        yield b"a"
        raise OSError("pipe gone")

    with pytest.raises(OSError, match="pipe gone"):
        list(wire.read_ahead(broken()))


def test_a_frame_is_sent_and_read_with_a_short_switch_interval(monkeypatch):
    """The writer thread and the read-ahead thread get the GIL within half a millisecond while a
    frame travels; the interval in force before comes back after it, also for a frame cut off."""
    from core.protocol import switch_interval

    before = sys.getswitchinterval()
    seen = []
    real = wire.chunk_packer

    def packer(codec):
        pack = real(codec)
        return lambda batch: (seen.append(sys.getswitchinterval()), pack(batch))[1]

    monkeypatch.setattr(wire, "chunk_packer", packer)
    read_fd, write_fd = os.pipe()
    out = bytearray()
    reader = threading.Thread(target=lambda: [out.extend(b) for b in iter(lambda: os.read(read_fd, 65536), b"")])
    reader.start()
    channel = Channel(write_fd)
    channel.codec, channel.columns = "zlib", True
    channel.send({"type": "call_trace", "call": residual_mlp_call(blocks=20), "run": 1})
    os.close(write_fd)
    reader.join(30)
    os.close(read_fd)
    assert seen and set(seen) == {min(before, switch_interval.STEP_SWITCH_S)}
    assert sys.getswitchinterval() == before
    during = []
    decoder = wire.StreamDecoder(lambda msg: during.append(sys.getswitchinterval()))
    decoder.feed(bytes(out[: len(out) // 2]))
    assert sys.getswitchinterval() == min(before, switch_interval.STEP_SWITCH_S) and decoder.partial
    decoder.close()  # the connection dropped mid-frame
    assert sys.getswitchinterval() == before
    wire.StreamDecoder(lambda msg: during.append(sys.getswitchinterval())).feed(bytes(out))
    assert during == [before]  # restored before the message is handed on


def test_big_tables_travel_in_blocks_each_built_as_it_comes(monkeypatch):
    """A call's nodes, tensors and storages go in blocks of BLOCK_ROWS rows, each followed by its
    row count; the reader has built every node (and freed their columns) before the tensors come."""
    monkeypatch.setattr(tc, "BLOCK_ROWS", 50)
    call = residual_mlp_call(blocks=30)  # 182 nodes: blocks of 50, 50, 50, 32
    lines = tc.encode(call).splitlines()
    done = [json.loads(line)[2] for line in lines if json.loads(line)[:2] == ["nodes", "done"]]
    assert done == [50, 50, 50, 32]
    reader = tr.ColumnReader("call")
    first_tensor = next(i for i, line in enumerate(lines) if line.startswith(b'["tensors.'))
    for line in lines[:first_tensor]:
        reader.feed(line)
    assert reader.built["nodes"] == call.nodes
    assert not [key for key in reader.cols if key[0].startswith("nodes.")]
    for line in lines[first_tensor:]:
        reader.feed(line)
    back = reader.result()
    assert back == call and back.nodes == reader.built["nodes"]
    trace = full_trace()
    monkeypatch.setattr(tc, "BLOCK_ROWS", 3)  # blocks that run across the two calls
    assert tr.decode(tc.encode(trace)).to_json() == trace.to_json()


def test_a_streamed_calls_nested_tables_travel_inside_its_blocks(monkeypatch):
    """Only the call's own lists go in blocks: each node's saved values and edges travel inside
    its node's block, however many there are (a call_trace message, as Debug streams it)."""
    monkeypatch.setattr(tc, "BLOCK_ROWS", 50)
    call = residual_mlp_call(blocks=30)
    call = replace(call, nodes=[replace(n, saved=[Saved(name="self", tensor=call.tensors[0].id), Saved(name="dim",
                                                                                                  value=[i, 2])])
                                for i, n in enumerate(call.nodes)])  # 364 saved rows, 50 nodes a block
    lines = [json.loads(line) for line in tc.encode(call).splitlines()]
    blocks = [p for p, kind, rows in lines if kind == "done" and rows]
    assert blocks == ["nodes"] * 4 + ["tensors"] * -(-len(call.tensors) // 50)
    assert [rows for p, kind, rows in lines if p == "nodes.saved" and kind == "done"] == [None] * 4
    got, _ = _stream(call, "zlib")
    assert got[1]["call"] == call


def test_a_wrong_value_in_a_later_block_is_named_by_its_row_in_the_whole_table(monkeypatch):
    monkeypatch.setattr(tc, "BLOCK_ROWS", 3)
    trace = full_trace()
    first = len(trace.calls[0].tensors)  # 10: blocks of rows 0-2, 3-5, 6-8, 9-11 (the second call's 0-2)
    items = column_items(tc.encode(trace))
    shapes = [i for i in items if i[0] == "calls.tensors.shape"]
    assert len(shapes) == 5
    shapes[3][1], shapes[3][2] = "vals", [[1], [2, -3], [4]]  # rows 9, 10, 11
    assert first == 10
    with pytest.raises(TraceFormatError, match=r"field 'calls\[1\]\.tensors\[0\]\.shape': expected a list of "
                                               r"non-negative integers"):
        tr.decode(joined(items))


def test_a_leafs_gradient_refers_to_its_row_across_blocks(monkeypatch):
    monkeypatch.setattr(tc, "BLOCK_ROWS", 2)
    call = call_with_leaf_grads(True)
    back = tr.decode(tc.encode(call), "call")
    assert back == call
    grads = {t.name: t.grad.values for t in back.tensors if t.grad is not None}
    assert len(grads) > 2 and all(back.leaf_grads[name] is values for name, values in grads.items())


@pytest.mark.parametrize("change, message", [
    (lambda items: items.__setitem__(item_index(items, "nodes", "done"), ["nodes", "done", 0]),
     r"field 'nodes': expected a block's row count, got 0"),
    (lambda items: items.__setitem__(item_index(items, "nodes", "done"), ["nodes", "done", "50"]),
     r"field 'nodes': expected a block's row count, got '50'"),
    (lambda items: items.insert(item_index(items, "nodes", "done"), ["nodes.next", "done", 3]),
     r"field 'nodes.next': is not a table that travels in blocks"),
    (lambda items: items.__setitem__(item_index(items, "nodes", "done"), ["nodes", "done", 60]),
     r"field 'nodes\[0\]\.id': expected 60 rows, got 50"),
    (lambda items: items.__setitem__(item_index(items, "nodes", "done"), ["nodes", "done", 10 ** 9]),
     r"field 'nodes': a block of 1000000000 rows after 0 runs past the table's 182"),
    (lambda items: items.pop(item_index(items, "nodes", "done", last=True)),
     r"field 'nodes': expected 182 rows in its blocks, got 150"),
])
def test_blocks_whose_row_counts_are_wrong_are_refused(monkeypatch, change, message):
    monkeypatch.setattr(tc, "BLOCK_ROWS", 50)
    items = column_items(tc.encode(residual_mlp_call(blocks=30)))
    change(items)
    with pytest.raises(TraceFormatError, match=message):
        tr.decode(joined(items), "call")
