"""NumPy arrays of the script that share memory with captured tensors (worker side).

``torch.from_numpy(a)`` and ``t.numpy()`` share one buffer: writing through either changes
both. The arrays are not tensors, so the trace would say nothing of them; this finds the
script's global arrays whose buffer lies inside a captured storage and records where, in that
storage's elements, each one sits (offset and strides), so the storage view can list them.
"""

from __future__ import annotations

from core.model.trace import StorageInfo, with_fields

try:
    import numpy as np
except ImportError:  # NumPy is optional for scripts
    np = None

LIMIT = 200  # arrays looked at, at most


def numpy_peers(namespace: dict, storage_ptrs: dict[tuple, str], storages: list[StorageInfo]) -> list[StorageInfo]:
    """``storages`` with a ``numpy`` list on each one that a global NumPy array shares.

    ``storage_ptrs`` maps (device, data pointer, nbytes) to storage ids, as the snapshot keeps them.
    """
    if np is None or not storage_ptrs:
        return storages
    spans = [(ptr, ptr + nbytes, sid) for (device, ptr, nbytes), sid in storage_ptrs.items()
             if device == "cpu" and ptr]
    found: dict[str, list[dict]] = {}
    seen = 0
    for name, value in list(namespace.items()):
        # type(), not isinstance(): a global's own __getattribute__ may raise on __class__.
        if not issubclass(type(value), np.ndarray) or type(name) is not str or name.startswith("_"):
            continue
        seen += 1
        if seen > LIMIT:
            break
        try:
            addr = value.__array_interface__["data"][0]
        except Exception:  # an ndarray subclass of the script's that refuses it
            continue
        for lo, hi, sid in spans:
            if lo <= addr < hi:
                item = value.itemsize
                found.setdefault(sid, []).append({
                    "name": name,
                    "shape": list(value.shape),
                    "strides": [s // item for s in value.strides],
                    "offset": (addr - lo) // item,
                    "dtype": str(value.dtype),
                })
                break
    if not found:
        return storages
    return [with_fields(s, numpy=found[s.id]) if s.id in found else s for s in storages]
