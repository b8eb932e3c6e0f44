"""Who holds memory in a captured graph: nodes ranked by the bytes of their saved tensors.

Computed from the trace alone (the GUI has no torch): a saved tensor's bytes are its own
elements (numel x element size), and tensors on one storage are counted once per node and
once in the total, since the graph keeps the storage alive, not each view.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from core.model.trace import CallInfo, TensorInfo


@dataclass(frozen=True)
class HeldBy:
    node: str
    name: str
    label: str | None
    bytes: int
    tensors: int


def tensor_bytes(t: TensorInfo) -> int:
    """Bytes the graph keeps for this tensor: its whole storage (a view keeps its base alive)."""
    own = prod(t.shape) * t.element_size if t.shape else t.element_size
    return max(t.nbytes, own) if t.storage else own


def held_by_nodes(call: CallInfo) -> tuple[list[HeldBy], int]:
    """Nodes with saved tensors, largest first, and the total over distinct storages."""
    tensors = call.tensor_map()
    rows: list[HeldBy] = []
    everything: dict[str, int] = {}
    for node in call.nodes:
        storages: dict[str, int] = {}
        count = 0
        for saved in node.saved:
            t = tensors.get(saved.tensor) if saved.tensor else None
            if t is None or saved.freed:
                continue
            count += 1
            key = t.storage or t.id
            storages[key] = tensor_bytes(t)
        if storages:
            total = sum(storages.values())
            everything.update(storages)
            rows.append(HeldBy(node.id, node.name, node.label, total, count))
    rows.sort(key=lambda r: (-r.bytes, r.node))
    return rows, sum(everything.values())


# The one byte unit of the app (the memory chart's axis, the memory and Problems panels, the
# inspector): KB, MB and GB of 2**10, 2**20 and 2**30 bytes, as PyTorch's memory summaries count.
BYTE_UNITS = (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10))


def format_bytes(n: int) -> str:
    """``512 B``, ``2.0 MB`` (2 * 2**20 bytes): a byte count in the app's one unit (``BYTE_UNITS``)."""
    for unit, size in BYTE_UNITS:
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def byte_unit(n: float) -> tuple[str, int]:
    """The unit an axis reaching ``n`` bytes reads best in: ``("MB", 2**20)`` for 50 MB, KB below 1 MB."""
    for unit, size in BYTE_UNITS:
        if n >= size:
            return unit, size
    return "KB", 1 << 10
