"""Memory sampling and saved-tensor accounting in the worker, and the samples the chart gets."""

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from core.worker.memory import MemorySampler  # noqa: E402
from core.worker.memory_sources import CpuSource, CudaSource, FakeCudaSource  # noqa: E402
from core.worker.saved_bytes import held_by_nodes, memory_report, saved_tensor_bytes  # noqa: E402
from core.model.trace import MemorySample  # noqa: E402
from widgets.memory.chart import MB, MemoryChart  # noqa: E402


def _wait(predicate, timeout=5.0):
    """Wait for the sampler thread (the machine may be busy) without a fixed sleep."""
    deadline = time.perf_counter() + timeout
    while not predicate():
        assert time.perf_counter() < deadline, "timed out waiting for samples"
        time.sleep(0.005)

# -- saved tensors --------------------------------------------------------------------------------


def test_saved_bytes_count_each_storage_once_and_drop_to_zero_after_backward():
    a = torch.randn(1000, requires_grad=True)
    b = a.sigmoid()  # saves its result: 4000 bytes
    assert saved_tensor_bytes([b]) == 4000
    c = b * b  # saves b twice: the same storage
    assert saved_tensor_bytes([c]) == 4000
    assert saved_tensor_bytes([c.grad_fn]) == 4000  # nodes work as roots too
    c.sum().backward()
    assert saved_tensor_bytes([c]) == 0


def test_saved_bytes_of_custom_functions_and_tensors_modified_in_place():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad * 2

    x = torch.randn(250, requires_grad=True)
    y = Double.apply(x)
    assert saved_tensor_bytes([y]) == 1000
    y.sum().backward()
    assert saved_tensor_bytes([y]) == 0
    h = x.clone()
    s = h.sin()  # saves h
    h.add_(1)  # stale, but still held until the graph dies
    assert saved_tensor_bytes([s]) == 1000


def _epochs(keep_graph: bool, epochs: int = 4) -> list[int]:
    torch.manual_seed(0)
    w = torch.randn(1000, requires_grad=True)
    kept, sizes = [], []
    for _ in range(epochs):
        x = torch.randn(1000)
        train = (x * w).sigmoid().sum()
        train.backward()  # frees this graph's saved tensors
        val = (torch.randn(1000) * w).sigmoid().sum()  # mul saves x, sigmoid its result
        kept.append(val if keep_graph else val.item())
        roots = [v for v in kept if isinstance(v, torch.Tensor)] + [train, val]
        sizes.append(saved_tensor_bytes(roots))
    return sizes


def test_keeping_loss_tensors_grows_saved_bytes_linearly_and_item_stays_flat():
    assert _epochs(keep_graph=True) == [8000, 16000, 24000, 32000]
    assert _epochs(keep_graph=False) == [8000, 8000, 8000, 8000]


def test_held_by_nodes_ranks_nodes_by_their_saved_bytes():
    from core.worker.capture.snapshot import Snapshotter

    a = torch.randn(1000, requires_grad=True)
    b = a.sigmoid()  # SigmoidBackward0 saves b
    c = b.exp()  # ExpBackward0 saves c
    d = c * a  # MulBackward0 saves c and a
    rows = held_by_nodes([d])
    assert [(r["name"], r["bytes"], r["tensors"]) for r in rows] == [
        ("MulBackward0", 8000, 2), ("ExpBackward0", 4000, 1), ("SigmoidBackward0", 4000, 1)]
    nodes, _, _ = Snapshotter(lambda t: None).walk([d.grad_fn])
    for r in rows:  # node_index is the trace's n<i>
        assert nodes[r["node_index"]].id == f"n{r['node_index']}"
        assert nodes[r["node_index"]].name == r["name"]
    report = memory_report([d])
    assert report["total"] == 12000  # a, b and c once each
    assert report["node_count"] == 4
    assert report["nodes"] == rows


# -- the sampler ----------------------------------------------------------------------------------


def test_cpu_source_reads_this_process_rss():
    psutil = pytest.importorskip("psutil")
    source = CpuSource()
    rss = source.read()["rss"]
    assert abs(rss - psutil.Process().memory_info().rss) < 64 << 20


def test_cpu_sampler_records_phases_around_forward_and_backward():
    roots: list = []
    sampler = MemorySampler(CpuSource(), rate_hz=200, saved_bytes_fn=lambda: saved_tensor_bytes(roots))
    sampler.start()
    sampler.mark("forward")
    a = torch.randn(1000, requires_grad=True)
    h = a
    for _ in range(4):
        h = h.sigmoid()  # each saves its 4000-byte result
    loss = h.sum()
    roots.append(loss)
    _wait(lambda: len(sampler.samples) >= 4)
    call_t = time.perf_counter() - sampler.origin
    start = sampler.mark("backward", {"type": "call", "index": 0, "t": call_t})
    _wait(lambda: sampler.samples[-1].phase == "backward" and sampler.samples[-1] is not start)
    loss.backward()
    after = sampler.mark("between")
    _wait(lambda: sampler.samples[-1].phase == "between" and sampler.samples[-1] is not after)
    sampler.stop()
    samples = sampler.samples
    phases = [s.phase for s in samples]
    assert {"forward", "backward", "between"} <= set(phases)
    assert phases.index("forward") < phases.index("backward") < phases.index("between")
    times = np.array([s.t for s in samples])
    assert np.all(np.diff(times) >= 0) and times[-1] > times[0]
    assert all(s.rss > 0 and s.device == "cpu" for s in samples)
    assert start.saved_bytes == 16000  # four sigmoid results
    assert after.saved_bytes == 0 and samples[-1].saved_bytes == 0
    assert all(s.saved_bytes == 16000 for s in samples if s.phase == "backward")
    assert sampler.calls == [{"index": 0, "t": call_t}]
    # The event dates the mark, or the sample just before when the sampler thread recorded one
    # between the event and the mark (the series stays in time order).
    before = samples[next(i for i, s in enumerate(samples) if s is start) - 1]
    assert start.t == max(call_t, before.t)
    assert sampler.overhead()["samples"] >= 3


def test_samples_stream_in_batches_and_drain_once():
    batches: list[list[dict]] = []
    sampler = MemorySampler(FakeCudaSource([(1, 2)]), rate_hz=200, on_batch=batches.append, batch_interval=0.02)
    with sampler:
        _wait(lambda: sum(len(b) for b in batches) >= 10)
        first = sampler.drain()
    rest = sampler.drain()
    assert sampler.drain() == []
    assert len(first) + len(rest) == len(sampler.samples)
    streamed = [d for b in batches for d in b]
    assert len(streamed) == len(sampler.samples)  # stop() sends what was left
    assert [MemorySample(**d) for d in streamed] == sampler.samples
    assert set(streamed[0]) >= {"t", "device", "allocated", "reserved", "rss", "saved_bytes", "phase"}


def test_marks_survive_thinning_and_failures_do_not_stop_sampling():
    def broken():
        raise RuntimeError("graph mutated")

    sampler = MemorySampler(FakeCudaSource([(1, 2)]), rate_hz=1000, saved_bytes_fn=broken, max_samples=16)
    sampler.start()
    for i in range(5):
        sampler.handle_event({"type": "call", "index": i, "t": time.perf_counter() - sampler.origin})
        _wait(lambda: sampler.samples[-1].phase == "backward" and len(sampler.drain()) > 2)
        sampler.handle_event({"type": "call_done", "index": i, "t": time.perf_counter() - sampler.origin})
        time.sleep(0.01)
    sampler.stop()
    samples = sampler.samples
    # Each thinning drops every other unmarked sample of the older half, so with the 10 marks
    # kept the series never holds more than 4 * 10 + 3 samples, however the ticks fall.
    assert len(samples) <= 43
    phases = ["start"] + [s.phase for s in samples]
    starts = [i for i in range(len(samples)) if phases[i + 1] == "backward" and phases[i] != "backward"]
    assert len(starts) == 5 and [c["index"] for c in sampler.calls] == list(range(5))


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.is_initialized(), reason="reads real counters")
def test_cuda_source_reads_zeros_without_initialising_cuda():
    source = CudaSource("cuda:1")
    assert source.device == "cuda:1"
    values = source.read()
    assert {k: values[k] for k in ("allocated", "reserved", "max_allocated")} == {
        "allocated": 0, "reserved": 0, "max_allocated": 0}
    assert values["rss"] > 0  # host memory is read on CUDA too
    assert not torch.cuda.is_initialized()


def test_fake_cuda_sampler_feeds_the_chart_allocated_and_reserved(qtbot):
    script = [(10 << 20, 32 << 20), (50 << 20, 64 << 20), (120 << 20, 128 << 20), (80 << 20, 128 << 20)]
    source = FakeCudaSource(script)
    sampler = MemorySampler(source, rate_hz=200)
    with sampler:
        sampler.mark("forward")
        _wait(lambda: source.reads >= 6)
    samples = sampler.samples
    assert all(s.device == "cuda:0" for s in samples)
    assert [(s.allocated, s.reserved) for s in samples[:4]] == script
    assert samples[-1].allocated == 80 << 20 and samples[-1].max_allocated == 120 << 20
    chart = MemoryChart()
    qtbot.addWidget(chart)
    chart.set_samples(samples)
    lines = chart.line_items()
    assert set(lines) == {"allocated", "reserved", "saved_bytes"}
    assert chart.units["left"] == ("MB", 1 << 20)  # 128 MB at most
    assert np.allclose(lines["allocated"].yData * MB, [s.allocated for s in samples])
    assert np.allclose(lines["reserved"].yData * MB, [s.reserved for s in samples])
    # The cache (reserved - allocated) is shaded between the two lines and explained on hover.
    assert chart.gap is not None and chart.gap.curves == [lines["allocated"], lines["reserved"]]
    assert "empty_cache" in chart.plot_widget.toolTip() and "reserved" in chart.plot_widget.toolTip()
    assert "cache (reserved − allocated): 48.0 MB" in chart.readout_html(3)  # 128 MB reserved, 80 allocated


# -- forward accounting and markers --------------------------------------------------------------


def test_forward_ops_add_their_saved_tensors_as_they_are_made():
    sampler = MemorySampler(FakeCudaSource([(0, 0)]), rate_hz=1, origin=time.perf_counter() - 60)  # 3 s budget
    sampler.op_interval = 0.0  # a sample per op
    sampler.mark("forward")
    a = torch.randn(1000, requires_grad=True)
    h = a
    for _ in range(3):
        h = h.sigmoid()  # saves its 4000-byte result
        sampler.on_node(h.grad_fn, "SigmoidBackward0 · line 1")
    b = h * h  # saves h twice: the storage counted once already by the last sigmoid
    sampler.on_node(b.grad_fn, "MulBackward0")
    saved = [s.saved_bytes for s in sampler.samples[1:]]
    assert saved == [4000, 8000, 12000, 12000]
    assert [s.where for s in sampler.samples[1:3]] == ["SigmoidBackward0 · line 1"] * 2
    sampler.op_interval = 60.0  # rate-limited: the bytes still count, the next sample waits a minute
    c = b.exp()  # saves its result: 4000 more
    assert sampler.on_node(c.grad_fn).saved_bytes == 16000
    d = c.exp()
    assert sampler.on_node(d.grad_fn) is None and len(sampler.samples) == 6
    assert sampler.note("zero_grad", "line 9").saved_bytes == 20000
    sampler._op_busy = 10.0  # past 5% of the run's minute: nodes wait for the next full walk
    e = d.exp()
    assert sampler.on_node(e.grad_fn) is None and sampler._saved == 20000


def test_the_sampler_starts_in_the_starting_phase():
    sampler = MemorySampler(FakeCudaSource([(0, 0)]), rate_hz=1)
    assert sampler._record(0.0).phase == "starting"
    assert sampler.mark("forward").phase == "forward"
    with pytest.raises(ValueError, match="unknown phase"):
        sampler.mark("warming up")


def test_markers_for_zero_grad_optimizer_step_and_empty_cache():
    from core.worker.memory_marks import describe_node, install_marks

    noted: list[tuple[str, str]] = []
    remove = install_marks(lambda kind, where: noted.append((kind, where)), lambda: 12)
    try:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.zero_grad()
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        model.zero_grad()
        torch.cuda.empty_cache()
    finally:
        remove()
    assert noted == [("zero_grad", "line 12"), ("optimizer.step", "line 12"), ("zero_grad", "line 12"),
                     ("empty_cache", "line 12")]
    opt.step()
    opt.zero_grad()
    assert len(noted) == 4  # removed: nothing more is noted
    y = torch.ones(2, requires_grad=True).exp()
    assert describe_node(y.grad_fn, 7, "fc1") == "ExpBackward0 · line 7 · fc1"
