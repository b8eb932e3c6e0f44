"""Rows of the storage view for NumPy arrays on a storage (plain data, no torch, no Qt)."""

from __future__ import annotations

from collections.abc import Sequence

from core.model.trace import StorageInfo


def _dims(values) -> str:
    return "(" + ", ".join(str(v) for v in values) + ("," if len(values) == 1 else "") + ")"


def numpy_rows(storages: Sequence[StorageInfo], storage_id: str | None) -> list[tuple[list[str], str]]:
    """([name, relation, shape, stride, offset], tooltip) for each NumPy array on the storage."""
    info = next((s for s in storages if s.id == storage_id), None) if storage_id else None
    out = []
    for a in (info.numpy or []) if info is not None else []:
        dtype = f" ({a['dtype']})" if a.get("dtype") else ""
        cells = [a["name"], f"NumPy array{dtype}, same memory", "[" + ", ".join(map(str, a["shape"])) + "]",
                 _dims(a["strides"]), str(a["offset"])]
        tip = (f"{a['name']} is a NumPy array on this memory (torch.from_numpy or .numpy()): writing to it "
               "changes the tensor, and the other way round. Autograd does not see writes made through NumPy.")
        out.append((cells, tip))
    return out


CLICK_HINT = " (click a tensor to show it)"


def shared_caption(tensors: int, arrays: int, *, screen: bool = True) -> str:
    """Caption of the same-storage list; the click hint only on screen (``screen=False`` for exports)."""
    parts = []
    if tensors:
        parts.append(f"{tensors} other tensor{'' if tensors == 1 else 's'}")
    if arrays:
        parts.append(f"{arrays} NumPy array{'' if arrays == 1 else 's'}")
    return "Same storage: " + " and ".join(parts) + (CLICK_HINT if tensors and screen else "")
