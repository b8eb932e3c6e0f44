"""Memory over time while a script runs, and who holds it (runs in the worker; torch imported lazily).

``MemorySampler`` reads a *source* (process RSS on CPU, the caching allocator on CUDA, or a
scripted fake for tests: ``core.worker.memory_sources``) on a daemon thread at a fixed rate,
off the script's thread, and also synchronously at *marks*. A run begins "starting" (imports, data, model set-up); the
capture marks the script's first op and each new graph after a backward ("forward"), the
start of each backward call ("backward") and its end ("between"), so phase boundaries are
exact in time rather than rounded to the sampling period. ``note()`` adds a marked sample
for ``zero_grad``, ``optimizer.step`` and ``empty_cache`` (see ``core.worker.memory_marks``).

During a forward pass ``on_node()`` adds each new node's saved tensors to the running total
(a few microseconds per node, under 5% of the run's time) and samples at most every 0.2 ms,
naming the op that ran, so the chart shows forward saving memory as it happens.

Saved-tensor bytes (``core.worker.saved_bytes``) are computed only on the script's thread: at
marks and in ``tick()``, which the capture may call as often as it likes. ``tick()`` walks at most every
``saved_interval`` and spends at most ~5% of the script's time walking (a 5,000-node graph
takes ~20 ms), so calling it from a per-op hook stays cheap. When ``saved_bytes_fn`` tells which
lists keep graphs alive (``core.worker.saved_bytes.LiveStorages``), samples carry those lists'
share as ``kept_bytes`` and the biggest list's name as ``kept_in``: the chart blames a peak made
of kept graphs on the line that keeps them.
Walking grad_fn graphs from the sampler thread is not safe: the autograd engine frees saved
tensors (and in-place ops replace a tensor's grad_fn) without holding the GIL, so a reader
on another thread could race with the release in C++. Periodic samples carry the last value.

Samples are buffered: ``drain()`` returns those not yet drained, and ``on_batch`` receives
new samples as plain dicts from the sampler thread about every 100 ms (the worker streams
them as ``{"type": "memory", "samples": [...]}``).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from dataclasses import asdict
from itertools import count
from typing import Callable

# Imported here, not inside the functions: they run while the script does, when the app's
# modules are out of sys.modules (the worker keeps the script's imports its own).
from core.model.trace import MemorySample
from core.worker.memory_sources import source_for
from core.worker.saved_bytes import node_storages

log = logging.getLogger(__name__)

PHASES = ("starting", "forward", "backward", "between")
DEFAULT_RATE_HZ = 50.0
BATCH_INTERVAL_S = 0.1
SAVED_INTERVAL_S = 0.05
SAVED_DUTY = 20  # tick() waits 20x as long as its last walk took: <= 5% overhead
OP_INTERVAL_S = 0.0002  # at most one sample per 0.2 ms from the ops of a forward pass
OP_DUTY = 0.05  # per-op accounting stops for a while once it took 5% of the run's time
MAX_SAMPLES = 200_000


# -- the sampler ---------------------------------------------------------------------------------


def sample_to_dict(sample: MemorySample) -> dict:
    """A sample as the plain dict streamed in ``memory`` messages."""
    return asdict(sample)


class MemorySampler:
    """Samples a memory source at ``rate_hz`` on a daemon thread and at phase marks.

    ``source`` is a source object or a device name ("cpu", "cuda:0"). ``origin`` is the
    ``time.perf_counter()`` value sample times count from: the capture's ``started``, so samples
    and call events share one clock. ``saved_bytes_fn`` returns the saved-tensor bytes of the
    live graphs (e.g. ``saved_tensor_bytes`` over the script's tensors); it runs on the
    script's thread only.
    """

    def __init__(
        self,
        source=None,
        rate_hz: float = DEFAULT_RATE_HZ,
        origin: float | None = None,
        saved_bytes_fn: Callable[[], int] | None = None,
        on_batch: Callable[[list[dict]], None] | None = None,
        batch_interval: float = BATCH_INTERVAL_S,
        saved_interval: float = SAVED_INTERVAL_S,
        max_samples: int = MAX_SAMPLES,
    ):
        if rate_hz <= 0:
            raise ValueError("rate_hz must be positive")
        if source is None or isinstance(source, str):
            source = source_for(source or "cpu")
        self.source = source
        self.device = getattr(self.source, "device", "cpu")
        self.period = 1.0 / rate_hz
        self.origin = time.perf_counter() if origin is None else origin
        self.saved_bytes_fn = saved_bytes_fn
        self.on_batch = on_batch
        self.batch_interval = batch_interval
        self.saved_interval = saved_interval
        self.max_samples = max(16, max_samples)
        self.phase = "starting"  # until the script's first op: worker start, imports, model building
        self.op_interval = OP_INTERVAL_S
        self.calls: list[dict] = []  # {"index", "t"} of each backward call start
        self._saved = 0
        self._kept = 0  # of _saved, held by graphs the script keeps in a list (``found.kept``)
        self._kept_in = ""
        self._live: dict = {}  # storages counted in _saved, when the walk reports them
        self._op_next = 0.0
        self._op_busy = 0.0  # seconds spent in on_node
        self._saved_next = 0.0
        self._seq = count()
        self._samples: list[MemorySample] = []
        self._seqs: list[int] = []
        self._marks: set[int] = set()  # seqs of mark samples: kept when thinning
        self._drained = -1
        self._batched = -1
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._busy_s = 0.0
        self._thread_reads = 0

    # -- control --------------------------------------------------------------------------
    def start(self) -> "MemorySampler":
        if self._thread is not None:
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop and join the thread; pending samples go to ``on_batch`` one last time."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join()
        self._emit_batch()

    def __enter__(self) -> "MemorySampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None

    # -- script-thread entry points -----------------------------------------------------------
    def mark(self, phase: str, event: dict | None = None, force_saved: bool = True) -> MemorySample:
        """Enter ``phase`` now and record a sample; call it on the script's thread.

        With a capture ``event`` ("call" or "call_done"), its ``t`` dates the sample, so the
        band edge and the call's marker coincide, and a "backward" mark records the call start.
        """
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; expected one of {PHASES}")
        t = event.get("t") if event else None
        if t is None:
            t = time.perf_counter() - self.origin
        call = None
        if phase == "backward" and event is not None and "index" in event:
            call = event["index"]
            self.calls.append({"index": call, "t": t})
        self.tick(force=force_saved)
        return self._record(t, phase, call=call)

    def handle_event(self, event: dict) -> None:
        """Mark phases from a capture event: "call" starts a backward, "call_done" ends it."""
        kind = event.get("type")
        if kind == "call":
            self.mark("backward", event)
        elif kind == "call_done":
            self.mark("between", event)

    def tick(self, force: bool = False) -> int:
        """Recompute saved-tensor bytes when due (or ``force``); script thread only."""
        if self.saved_bytes_fn is None:
            return self._saved
        now = time.perf_counter()
        if force or now >= self._saved_next:
            try:
                found = self.saved_bytes_fn()
                if isinstance(found, dict):
                    self._live = dict(found)
                    self._saved = sum(found.values())
                else:
                    self._live = {}
                    self._saved = int(found)
                kept = getattr(found, "kept", None) or {}
                self._kept = sum(kept.values())
                self._kept_in = max(kept, key=kept.get) if kept else ""
            except Exception:
                log.debug("saved_bytes_fn failed", exc_info=True)
            took = time.perf_counter() - now
            self._saved_next = now + max(self.saved_interval, SAVED_DUTY * took)
        return self._saved

    def on_node(self, node, where: str = "") -> MemorySample | None:
        """A node the forward pass just created: add what it saves, and sample when due.

        Script thread only, called per op. Reading one node's saved tensors costs a few
        microseconds; a sample is taken at most every ``op_interval``, the full walk of
        ``tick()`` keeps its own duty limit, and the whole stays under ``OP_DUTY`` of the run's
        time (past it, nodes are left to the next full walk). So the forward pass shows memory
        being saved as it happens rather than a jump at the first backward.
        """
        start = time.perf_counter()
        if self._op_busy > OP_DUTY * (start - self.origin):
            return None  # over budget: the next full walk (tick or mark) counts these nodes
        for key, nbytes in node_storages(node).items():
            if key not in self._live:
                self._live[key] = nbytes
                self._saved += nbytes
        sample = None
        if start >= self._op_next:
            self._op_next = start + self.op_interval
            self.tick()
            sample = self._record(start - self.origin, where=where)
        self._op_busy += time.perf_counter() - start
        return sample

    def note(self, kind: str, where: str = "") -> MemorySample:
        """An event worth a marker on the chart (``zero_grad``, ``optimizer.step``, ``empty_cache``)."""
        self.tick(force=True)
        return self._record(time.perf_counter() - self.origin, mark=kind, where=where)

    # -- samples --------------------------------------------------------------------------
    def _record(self, t: float, phase: str | None = None, mark: str = "", where: str = "",
                call: int | None = None) -> MemorySample:
        """Append a sample; ``phase`` given (a mark) enters that phase, None keeps the current one."""
        try:
            values = self.source.read()
        except Exception:
            log.debug("memory source failed", exc_info=True)
            values = {}
        with self._lock:
            # The phase is read and set under the lock, so a periodic sample can never land
            # after a mark's sample while still carrying the phase before it.
            if phase is not None:
                self.phase = phase
            if self._samples and self._samples[-1].t > t:
                # A mark dated by its event can precede a periodic sample taken a few
                # microseconds later but recorded first: keep the series in time order.
                t = self._samples[-1].t
            sample = MemorySample(
                t=t,
                device=self.device,
                allocated=int(values.get("allocated", 0)),
                reserved=int(values.get("reserved", 0)),
                rss=int(values.get("rss", 0)),
                saved_bytes=self._saved,
                phase=self.phase,
                max_allocated=int(values.get("max_allocated", 0)),
                mark=mark,
                where=where,
                kept_bytes=self._kept,
                kept_in=self._kept_in,
                call=call,
            )
            seq = next(self._seq)
            self._samples.append(sample)
            self._seqs.append(seq)
            if phase is not None or mark:
                self._marks.add(seq)
            if len(self._samples) > self.max_samples:
                self._thin()
        return sample

    def _thin(self) -> None:
        """Halve the resolution of the older half, keeping every mark (the phase edges)."""
        half = len(self._samples) // 2
        keep_s, keep_q = [], []
        for i in range(half):
            q = self._seqs[i]
            if i % 2 == 0 or q in self._marks:
                keep_s.append(self._samples[i])
                keep_q.append(q)
        self._samples[:half] = keep_s
        self._seqs[:half] = keep_q

    def _since(self, seq: int) -> tuple[list[MemorySample], int]:
        start = bisect.bisect_right(self._seqs, seq)
        if start == len(self._seqs):
            return [], seq
        return self._samples[start:], self._seqs[-1]

    def drain(self) -> list[MemorySample]:
        """Samples recorded since the last ``drain()``, in time order."""
        with self._lock:
            new, self._drained = self._since(self._drained)
        return new

    @property
    def samples(self) -> list[MemorySample]:
        """Every sample kept (older ones thinned past ``max_samples``), in time order."""
        with self._lock:
            return list(self._samples)

    def overhead(self) -> dict:
        """Time the sampler thread spent reading: how much it takes from the script."""
        n = self._thread_reads
        return {"samples": n, "busy_s": self._busy_s, "per_sample_us": 1e6 * self._busy_s / n if n else 0.0}

    def _emit_batch(self) -> None:
        if self.on_batch is None:
            return
        with self._lock:
            new, self._batched = self._since(self._batched)
        if new:
            try:
                self.on_batch([sample_to_dict(s) for s in new])
            except Exception:
                log.exception("on_batch failed")

    def _run(self) -> None:
        clock = time.perf_counter
        next_t = clock()
        last_batch = next_t
        while True:
            next_t += self.period
            delay = next_t - clock()
            if delay < 0:
                next_t = clock()  # fell behind (a long GIL hold): skip the missed ticks
            elif self._stop.wait(delay):
                return
            if self._stop.is_set():
                return
            t0 = clock()
            self._record(t0 - self.origin)
            if self.on_batch is not None and t0 - last_batch >= self.batch_interval:
                last_batch = t0
                self._emit_batch()
            self._busy_s += clock() - t0
            self._thread_reads += 1
