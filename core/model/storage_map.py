"""Where a tensor's elements live in its storage: offsets, block coverage, values and sharing.

Pure functions over the trace model (no Qt, no torch), plus the storage view's picture and grid
geometry, so its arithmetic is tested without a display. Offsets are storage element indices (not bytes); a tensor element
at index ``(i, j, ...)`` lives at ``storage_offset + i * stride[0] + j * stride[1] + ...``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from core.model.trace import StorageInfo, TensorInfo

# covered_offsets returns None above this many elements; block coverage then summarises.
ELEMENT_LIMIT = 1_000_000
# storage_values fills cells only for storages up to this many elements.
VALUE_LIMIT = 4096
# storage_picture draws one cell per element up to this many elements, blocks above.
ELEMENT_CELLS = 4096
MAX_BLOCKS = 1024


class SharedTensor(NamedTuple):
    """Another tensor on the same storage and how it relates to the selected one."""

    tensor: TensorInfo
    relation: str


# -- geometry ------------------------------------------------------------------------------


def numel(shape: Sequence[int]) -> int:
    """Number of elements of a shape (1 for a scalar)."""
    return math.prod(shape)


def contiguity(shape: Sequence[int], stride: Sequence[int]) -> bool:
    """Whether shape/stride is row-major with no gaps, as torch's ``is_contiguous()``."""
    if len(shape) != len(stride) or 0 in shape:
        return True
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride)):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


def _offset_array(shape: Sequence[int], stride: Sequence[int], storage_offset: int) -> np.ndarray:
    """Storage index of every element, row-major, as one int64 array (built by broadcasting)."""
    idx = np.full((), storage_offset, dtype=np.int64)
    for size, step in zip(shape, stride):
        idx = idx[..., None] + np.arange(size, dtype=np.int64) * step
    return idx.reshape(-1)


def covered_offsets(shape: Sequence[int], stride: Sequence[int], storage_offset: int,
                    limit: int = ELEMENT_LIMIT) -> list[int] | None:
    """The storage index of each tensor element in logical (row-major) order.

    ``x.t()`` of a (3, 4) ``x`` gives ``[0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11]``. Returns None when
    the tensor has more than ``limit`` elements or shape and stride disagree.
    """
    if len(shape) != len(stride) or numel(shape) > limit:
        return None
    return _offset_array(shape, stride, storage_offset).tolist()


def extent(shape: Sequence[int], stride: Sequence[int], storage_offset: int) -> int:
    """One past the highest storage index the tensor touches (0 for an empty tensor)."""
    if 0 in shape or len(shape) != len(stride):
        return 0
    return storage_offset + sum((n - 1) * s for n, s in zip(shape, stride) if s > 0) + 1


def storage_numel(tensor: TensorInfo) -> int:
    """Elements in the tensor's whole storage (``nbytes // element_size``)."""
    return tensor.nbytes // tensor.element_size if tensor.element_size > 0 else 0


def block_size(storage_numel: int, blocks: int) -> int:
    """Elements per block: the smallest power of two that fits the storage in ``blocks`` blocks."""
    need = max(1, -(-storage_numel // max(1, blocks)))
    return 1 << (need - 1).bit_length()


def _merge_dims(shape: Sequence[int], stride: Sequence[int]) -> list[tuple[int, int]]:
    """Drop size-1 dims and fuse neighbours that step through memory as one dim."""
    dims: list[tuple[int, int]] = []
    for size, step in zip(shape, stride):
        if size == 1:
            continue
        if dims and dims[-1][1] == size * step:
            dims[-1] = (dims[-1][0] * size, step)
        else:
            dims.append((size, step))
    return dims


def block_coverage(shape: Sequence[int], stride: Sequence[int], storage_offset: int, storage_numel: int,
                   blocks: int, limit: int = ELEMENT_LIMIT) -> list[float]:
    """Fraction of each block of the storage that the tensor covers, in [0, 1].

    Each block holds ``block_size(storage_numel, blocks)`` elements (the last may hold fewer), so
    the list has at most ``blocks`` entries. Exact up to ``limit`` elements; above that the
    innermost dims are summarised as segments of even density, exact when they are dense.
    """
    size = block_size(storage_numel, blocks)
    count = -(-storage_numel // size)
    if count == 0:
        return []
    sizes = np.full(count, size, dtype=np.float64)
    sizes[-1] = storage_numel - size * (count - 1)
    if 0 in shape or len(shape) != len(stride):
        return [0.0] * count
    if numel(shape) <= limit:
        offs = np.unique(_offset_array(shape, stride, storage_offset))
        offs = offs[(offs >= 0) & (offs < storage_numel)]
        hits = np.bincount(offs // size, minlength=count)[:count]
        return np.minimum(hits / sizes, 1.0).tolist()
    outer = _merge_dims(shape, stride)
    inner: list[tuple[int, int]] = []
    while outer and math.prod(n for n, _ in outer) > limit:
        inner.insert(0, outer.pop())
    starts = _offset_array([n for n, _ in outer], [s for _, s in outer], storage_offset)
    span = sum((n - 1) * abs(s) for n, s in inner) + 1
    density = min(1.0, math.prod(n for n, _ in inner) / span)
    a = np.clip(starts, 0, storage_numel)
    b = np.clip(starts + span, 0, storage_numel)
    keep = b > a
    a, b = a[keep], b[keep]
    first, last = a // size, (b - 1) // size
    acc = np.zeros(count + 1)
    same = first == last
    np.add.at(acc, first[same], density * (b - a)[same])
    split = ~same
    np.add.at(acc, first[split], density * ((first + 1) * size - a)[split])
    np.add.at(acc, last[split], density * (b - last * size)[split])
    middle = np.zeros(count + 1)
    np.add.at(middle, first[split] + 1, density * size)
    np.add.at(middle, last[split], -density * size)
    acc += np.cumsum(middle)
    return np.clip(acc[:count] / sizes, 0.0, 1.0).tolist()


def covered_blocks(shape: Sequence[int], stride: Sequence[int], storage_offset: int, storage_numel: int,
                   blocks: int) -> list[bool]:
    """Which blocks of the storage hold at least one covered element (see ``block_coverage``)."""
    return [f > 0 for f in block_coverage(shape, stride, storage_offset, storage_numel, blocks)]


def stride_sentence(shape: Sequence[int], stride: Sequence[int], storage_offset: int, name: str = "t") -> str:
    """Plain words for how the tensor walks memory, for the panel's caption."""
    if not shape:
        return f"{name} is a scalar: its one element is storage[{storage_offset}]."
    moves = [f"+{s}" if s >= 0 else str(s) for s in stride]
    start = f"{name}[{', '.join('0' * len(shape))}] is storage[{storage_offset}]"
    if len(shape) == 1:
        return f"{start}; each next element is {moves[0]} further in memory."
    steps = ", ".join(f"dim {d} {m}" for d, m in enumerate(moves))
    return f"{start}; one step along a dim moves this many elements in memory (the stride): {steps}."


def shape_text(shape: Sequence[int]) -> str:
    """``[4, 3]``."""
    return "[" + ", ".join(str(s) for s in shape) + "]"


def stride_text(stride: Sequence[int]) -> str:
    """``(1, 4)``, or ``(1,)`` for one dim, as torch prints strides."""
    return "(" + ", ".join(str(s) for s in stride) + ("," if len(stride) == 1 else "") + ")"


def index_text(position: int, shape: Sequence[int]) -> str:
    """``[1,2]``: the tensor index of the ``position``-th element in row-major order."""
    return "[" + ",".join(str(i) for i in index_of(position, shape)) + "]"


def index_of(position: int, shape: Sequence[int]) -> tuple[int, ...]:
    """The tensor index of the ``position``-th element in row-major order."""
    idx, rest = [], position
    for size in reversed(shape):
        rest, i = divmod(rest, max(1, size))
        idx.append(i)
    return tuple(reversed(idx))


def traversal(offsets: Sequence[int], count: int) -> tuple[list[float], dict[int, int], dict[int, int]]:
    """Per storage element of ``count``: covered (1.0/0.0), first logical position, and visit count."""
    offs = np.asarray(offsets, dtype=np.int64)
    inside = np.flatnonzero((offs >= 0) & (offs < count))
    cells, first, visits = np.unique(offs[inside], return_index=True, return_counts=True)
    cover = np.zeros(count)
    cover[cells] = 1.0
    first_step = dict(zip(cells.tolist(), inside[first].tolist()))
    return cover.tolist(), first_step, dict(zip(cells.tolist(), visits.tolist()))


# -- the trace -----------------------------------------------------------------------------


def tensor_table(tensors: Mapping[str, TensorInfo] | Sequence[TensorInfo]) -> dict[str, TensorInfo]:
    """Tensors by id, from a list or a mapping."""
    if isinstance(tensors, Mapping):
        return dict(tensors)
    return {t.id: t for t in tensors}


def tensor_label(tensor: TensorInfo | None, tensor_id: str = "") -> str:
    """The script's name of a tensor, or its id marked unnamed."""
    if tensor is None:
        return f"{tensor_id} (not captured)"
    return tensor.name or f"{tensor.id} (unnamed)"


def sharing(tensors: Mapping[str, TensorInfo] | Sequence[TensorInfo], tensor_id: str) -> list[SharedTensor]:
    """The other tensors on ``tensor_id``'s storage, in trace order, each with its relation.

    Relations describe the other tensor: "base of <selected>", "view of <its base>",
    "detach() / same data" (neither is a view, same offset, shape and stride) or "shares storage".
    """
    table = tensor_table(tensors)
    me = table.get(tensor_id)
    if me is None or me.storage is None:
        return []
    out = []
    for other in table.values():
        if other.id == me.id or other.storage != me.storage:
            continue
        if other.id == me.base:
            relation = f"base of {tensor_label(me)}"
        elif other.is_view and other.base is not None:
            relation = f"view of {tensor_label(table.get(other.base), other.base)}"
        elif (not other.is_view and not me.is_view and other.storage_offset == me.storage_offset
              and list(other.shape) == list(me.shape) and list(other.stride) == list(me.stride)):
            relation = "detach() / same data"
        else:
            relation = "shares storage"
        out.append(SharedTensor(other, relation))
    return out


def storage_values(tensors: Mapping[str, TensorInfo] | Sequence[TensorInfo], tensor_id: str,
                   count: int, limit: int = VALUE_LIMIT) -> list | None:
    """The value of each of ``count`` storage elements, None where no captured tensor shows it.

    Every tensor on the storage whose full values were captured contributes through its offsets
    (a whole-storage base fills every cell); the selected tensor's own values are written last.
    Returns None for storages above ``limit`` elements.
    """
    table = tensor_table(tensors)
    me = table.get(tensor_id)
    if me is None or count > limit:
        return None
    cells: list = [None] * count
    others = [t for t in table.values() if t.storage is not None and t.storage == me.storage and t.id != me.id]
    for t in [*others, me]:
        data = t.values.data
        if data is None or len(data) != numel(t.shape):
            continue
        offs = covered_offsets(t.shape, t.stride, t.storage_offset, limit=limit)
        if offs is None:
            continue
        for off, value in zip(offs, data):
            if 0 <= off < count:
                cells[off] = value
    return cells


@dataclass
class StoragePicture:
    """What the storage view draws for one tensor: cells, coverage, traversal and values."""

    name: str = ""
    storage: str = ""
    storage_offset: int = 0
    count: int = 0  # cells
    block: int = 1  # storage elements per cell
    storage_numel: int = 0
    shape: list[int] = field(default_factory=list)
    dtype: str = "float32"
    offsets: list[int] | None = None  # storage index of each element, in traversal order
    coverage: list[float] = field(default_factory=list)  # per cell, 0..1
    values: list | None = None  # per cell, None where unknown
    first_step: dict[int, int] = field(default_factory=dict)  # cell -> first row-major position on it
    visits: dict[int, int] = field(default_factory=dict)  # cell -> how many positions land on it


def storage_picture(tensors: Mapping[str, TensorInfo] | Sequence[TensorInfo], tensor_id: str,
                    storages: Sequence[StorageInfo] = (), element_cells: int = ELEMENT_CELLS,
                    max_blocks: int = MAX_BLOCKS) -> StoragePicture | None:
    """Everything the storage view draws for ``tensor_id``; None when the tensor is not in ``tensors``.

    Storages up to ``element_cells`` elements get one cell per element; bigger ones get at most
    ``max_blocks`` cells of ``block`` elements each, shaded by the fraction covered.
    """
    table = tensor_table(tensors)
    t = table.get(tensor_id)
    if t is None:
        return None
    info = next((s for s in storages if s.id == t.storage), None) if t.storage else None
    count = info.nbytes // t.element_size if info is not None and t.element_size > 0 else storage_numel(t)
    count = max(count, extent(t.shape, t.stride, t.storage_offset))
    offsets = covered_offsets(t.shape, t.stride, t.storage_offset)
    pic = StoragePicture(name=tensor_label(t), storage=t.storage or "(not captured)",
                         storage_offset=t.storage_offset, storage_numel=count, shape=list(t.shape), dtype=t.dtype,
                         offsets=offsets)
    if count > element_cells:
        pic.block = block_size(count, max_blocks)
        pic.coverage = block_coverage(t.shape, t.stride, t.storage_offset, count, max_blocks)
        pic.count = len(pic.coverage)
        return pic
    pic.count = count
    if offsets is None:
        pic.coverage = block_coverage(t.shape, t.stride, t.storage_offset, count, count)
    else:
        pic.coverage, pic.first_step, pic.visits = traversal(offsets, count)
    pic.values = storage_values(table, t.id, count)
    return pic


def cell_description(pic: StoragePicture, index: int, fmt=str) -> str:
    """What cell ``index`` of a picture holds, in words (its tooltip); ``fmt`` formats a value."""
    frac = pic.coverage[index] if index < len(pic.coverage) else 0.0
    if pic.block > 1:
        first = index * pic.block
        last = min(pic.storage_numel, first + pic.block) - 1
        return f"storage[{first:,}..{last:,}]: {frac:.0%} covered by {pic.name}"
    value = pic.values[index] if pic.values is not None and index < len(pic.values) else None
    text = f"storage[{index}]" + (f" = {fmt(value)}" if value is not None else "")
    step = pic.first_step.get(index)
    if step is not None:
        text += f"\n{pic.name}{index_text(step, pic.shape)}, element {step} in row-major order"
        if pic.visits.get(index, 1) > 1:
            text += f" (visited {pic.visits[index]} times)"
    elif frac == 0:
        text += f"\nnot part of {pic.name}"
    return text


# -- geometry of the drawing ---------------------------------------------------------------

ARROW_LIMIT = 256  # hops are drawn between covered cells when the tensor has at most this many elements


def hops_shown(pic: StoragePicture) -> bool:
    """Whether the view draws the hops from each covered cell to the next."""
    return pic.offsets is not None and 1 < len(pic.offsets) <= ARROW_LIMIT and pic.block == 1


Point = tuple[float, float]


@dataclass
class StorageGrid:
    """Where the storage view draws each cell: rows of ``cols`` square cells with room above and
    below each row for the hops between covered cells. Plain numbers, so it is tested without Qt."""

    count: int = 0
    cols: int = 1
    size: float = 64.0
    gap: float = 6.0
    arc: float = 8.0  # room above and below each row
    left: float = 8.0  # x of the first column
    top: float = 34.0  # y where the first row's room begins
    bracket: bool = False  # a bracket under the cells before the storage offset

    @classmethod
    def for_picture(cls, pic: StoragePicture, width: float, left: float = 8.0, top: float = 34.0,
                    cell: float | None = None) -> StorageGrid:
        """Cells sized by how many there are (or ``cell`` px, smaller, to fit a height), as many columns as
        fit ``width`` (multiples of 8 when wrapping)."""
        if pic.block > 1:
            size, gap = 22.0, 3.0
        else:
            size, gap = (64.0, 6.0) if pic.count <= 64 else (42.0, 4.0) if pic.count <= 512 else (28.0, 3.0)
        if cell is not None and cell < size:
            size, gap = cell, max(3.0, round(cell / 10))
        fit = max(1, int((max(1.0, width - left - 8) + gap) // (size + gap)))
        cols = max(1, pic.count) if pic.count <= fit else next((fit - fit % m for m in (8, 4) if fit >= m), fit)
        arc = max(gap, size * 0.8) if hops_shown(pic) else gap + 2
        bracket = pic.block == 1 and 0 < pic.storage_offset <= 3 * cols
        if bracket:
            arc = max(arc, 20.0)
        return cls(pic.count, cols, size, gap, arc, left, top, bracket)

    @property
    def pitch(self) -> float:
        return self.size + 2 * self.arc

    @property
    def rows(self) -> int:
        return max(1, -(-self.count // self.cols))

    def height(self) -> float:
        return self.top + self.rows * self.pitch + 8

    def cell(self, index: int) -> tuple[float, float, float, float]:
        """x, y, width, height of cell ``index``."""
        row, col = divmod(index, self.cols)
        return (self.left + col * (self.size + self.gap), self.top + self.arc + row * self.pitch, self.size, self.size)

    def cell_at(self, x: float, y: float) -> int | None:
        """The cell under a point, or None over gaps and margins."""
        col, row = int((x - self.left) // (self.size + self.gap)), int((y - self.top - self.arc) // self.pitch)
        index = row * self.cols + col
        if not (0 <= col < self.cols and row >= 0 and index < self.count):
            return None
        cx, cy, w, h = self.cell(index)
        return index if cx <= x < cx + w and cy <= y < cy + h else None

    def hop(self, a: int, b: int, lane: int = 0) -> tuple[str, list[Point]]:
        """How to draw the hop from cell a to cell b.

        Within a row: ``("arc", [start, control, control, end])``, above the row going right and
        below it going left. Across rows: ``("route", corners)`` running through the gaps between
        rows and columns so it never crosses a cell; ``lane`` spreads parallel routes apart.
        """
        (xa, ya0, _, _), (xb, yb0, _, _) = self.cell(a), self.cell(b)
        ax, bx, s = xa + self.size / 2, xb + self.size / 2, self.size
        if ya0 == yb0:
            right = b > a
            ya = ya0 if right else ya0 + s
            h = min(self.arc * 0.9, 12 + 0.18 * abs(bx - ax)) * (-1 if right else 1)
            start = ax + (5 if right else -5)
            return "arc", [(start, ya), (start, ya + h), (bx, ya + h), (bx, ya)]
        down = yb0 > ya0
        sign, shift = (1 if down else -1), (lane % 5 - 2) * 3.0
        ya, yb = (ya0 + s, yb0) if down else (ya0, yb0 + s)
        near_a = ya + sign * (self.arc + shift)
        pts = [(ax, ya), (ax, near_a)]
        if abs(yb0 - ya0) > self.pitch + 1:  # rows apart: go along the gap left of b's column
            near_b, xg = yb - sign * (self.arc - shift), xb - self.gap / 2
            pts += [(xg, near_a), (xg, near_b), (bx, near_b)]
        else:
            pts.append((bx, near_a))
        pts.append((bx, yb))
        pts = [q for k, q in enumerate(pts) if k == 0 or q != pts[k - 1]]
        return "route", [q for k, q in enumerate(pts) if k in (0, len(pts) - 1) or not (
            pts[k - 1][0] == q[0] == pts[k + 1][0] or pts[k - 1][1] == q[1] == pts[k + 1][1])]
