"""Where memory is read from while a script runs (in the worker; torch and psutil imported lazily).

``CpuSource`` reads this process's resident set size, ``CudaSource`` the caching allocator's
counters, ``FakeCudaSource`` a scripted list of values for tests; ``source_for`` picks the one
for a device. ``core.worker.memory.MemorySampler`` reads them on its thread and at marks.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Sequence

log = logging.getLogger(__name__)


class CpuSource:
    """Resident set size of this process.

    On Linux one ``pread`` of ``/proc/self/statm`` on a descriptor kept open: psutil opens,
    reads and closes the file, and each of those system calls lets go of the GIL, which the
    sampler thread must then win back from the script. Elsewhere psutil.
    """

    device = "cpu"

    def __init__(self):
        self._fd: int | None = None
        self._process = None
        try:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY)
            self._page = os.sysconf("SC_PAGE_SIZE")
            return
        except (OSError, ValueError, AttributeError):
            pass
        try:
            import psutil

            self._process = psutil.Process()
        except Exception as exc:  # psutil missing or the process table unreadable
            log.warning("process memory is not readable (%s); RSS reads as 0", exc)

    def read(self) -> dict:
        if self._fd is not None:
            return {"rss": int(os.pread(self._fd, 256, 0).split()[1]) * self._page}
        if self._process is not None:
            return {"rss": self._process.memory_info().rss}
        return {"rss": 0}

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self):
        self.close()


class CudaSource:
    """The CUDA caching allocator's counters for one device ("cuda" means cuda:0).

    ``torch.cuda.memory_stats`` is empty before CUDA is initialised and never initialises it,
    so reading from the sampler thread cannot create a context on its own.
    """

    def __init__(self, device: str = "cuda"):
        import torch

        dev = torch.device(device)
        self.index = dev.index if dev.index is not None else 0
        self.device = f"cuda:{self.index}"
        self._cuda = torch.cuda
        self._host = CpuSource()  # the process's host memory too: a CUDA script still fills RAM

    def read(self) -> dict:
        stats = self._cuda.memory_stats(self.index)  # one call: each counter alone rebuilds all stats
        return {
            "allocated": stats.get("allocated_bytes.all.current", 0),
            "reserved": stats.get("reserved_bytes.all.current", 0),
            "max_allocated": stats.get("allocated_bytes.all.peak", 0),
            "rss": self._host.read()["rss"],
        }


class FakeCudaSource:
    """Scripted allocator values, so tests drive the CUDA code paths without a GPU.

    ``values`` holds ``(allocated, reserved)`` pairs or dicts; each read returns the next one
    and the last repeats once the script runs out. Thread-safe: marks read from the script's
    thread while the sampler thread reads too.
    """

    def __init__(self, values: Sequence[tuple[int, int] | dict], device: str = "cuda:0"):
        if not values:
            raise ValueError("FakeCudaSource needs at least one value")
        self.device = device
        self.values = [v if isinstance(v, dict) else {"allocated": v[0], "reserved": v[1]} for v in values]
        self.reads = 0
        self._peak = 0
        self._lock = threading.Lock()

    def read(self) -> dict:
        with self._lock:
            value = dict(self.values[min(self.reads, len(self.values) - 1)])
            self.reads += 1
            self._peak = max(self._peak, value.get("allocated", 0))
            value.setdefault("max_allocated", self._peak)
            return value


def source_for(device: str):
    """The source that measures ``device``: the CUDA allocator for CUDA, process RSS otherwise."""
    if str(device).startswith("cuda"):
        return CudaSource(device)
    return CpuSource()
