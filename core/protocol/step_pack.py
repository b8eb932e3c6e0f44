"""Step records as sent in a ``steps`` batch: each gradient preview once.

While backward runs on (Continue), the gradient a node produces is the gradient the next
node receives: the stepper shares one preview dict between the two records, and JSON would
spell it out twice. ``pack_records`` puts every distinct preview of a batch in one
``previews`` list and leaves its position in the records; ``unpack_steps`` (on the app's
reader thread, before anything reads the batch) puts the previews back, shared, so every
reader sees the records the stepper made. Plain data, standard library only.
"""

from __future__ import annotations

GRAD_KEYS = ("grad_outputs", "grad_inputs")


def _each_preview(record: dict, fn) -> None:
    """Put ``fn(preview)`` in ``record`` (in place) for each of its gradient previews: the
    lists under ``GRAD_KEYS`` and the values of ``leaf_grads``."""
    for key in GRAD_KEYS:
        grads = record.get(key)
        if grads:
            record[key] = [fn(g) for g in grads]
    leaf = record.get("leaf_grads")
    if leaf:
        record["leaf_grads"] = {name: fn(v) for name, v in leaf.items()}


def pack_records(records: list[dict]) -> tuple[list[dict], list]:
    """(records with previews replaced by their position in ``previews``, previews).

    The records given are not changed (the stepper keeps them)."""
    previews: list = []
    seen: dict[int, int] = {}

    def ref(preview):
        if not isinstance(preview, dict):
            return preview  # None (no gradient on that edge)
        at = seen.get(id(preview))
        if at is None:
            at = seen[id(preview)] = len(previews)
            previews.append(preview)
        return at

    packed = []
    for record in records:
        out = dict(record)
        _each_preview(out, ref)
        packed.append(out)
    return packed, previews


def unpack_steps(msg: dict) -> dict:
    """A ``steps`` message with its records' previews put back in place (in place; returned).

    A message without ``previews`` (an older worker's) is left as it is; a position out of range
    becomes None, so a damaged batch shows "None" on an edge rather than failing the step log."""
    previews = msg.pop("previews", None)
    if previews is None:
        return msg
    n = len(previews)

    def value(v):
        if isinstance(v, int) and not isinstance(v, bool):
            return previews[v] if 0 <= v < n else None
        return v

    for record in msg.get("records") or ():
        if isinstance(record, dict):
            _each_preview(record, value)
    return msg
