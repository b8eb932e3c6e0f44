"""A DDP run's traces as files: one per rank, named so that they open together again.

``trace --nproc N --json run.json`` and File > Export… > JSON of a DDP run on screen write the
rank shown (or picked) to ``run.json`` and each other rank's trace beside it as
``run.rank1.json``, ``run.rank2.json``, … Opening any one of them (File > Open Trace…,
``view``) finds the others by that name and brings back the rank picker, on the rank of the
file opened. Which rank a trace holds is read from its calls' all-reduce records, not from
the file name, so a renamed file is still placed right and a stray one is left out.
"""

from __future__ import annotations

import glob
import re
from pathlib import Path

from core.model.trace import Trace, TraceFormatError
from core.model.trace_json import load_trace, trace_from_dict

_RANK_NAME = re.compile(r"^(?P<stem>.+)\.rank(?P<rank>[0-9]+)$")


def rank_of(trace: Trace) -> int | None:
    """The rank a trace was captured on, from its all-reduce records (None: not a DDP run)."""
    return _all_reduce(trace, "rank")


def world_of(trace: Trace) -> int | None:
    """The number of ranks of the run a trace comes from (None: not a DDP run)."""
    return _all_reduce(trace, "world_size")


def _all_reduce(trace: Trace, key: str) -> int | None:
    for call in trace.calls:
        ar = call.options.get("all_reduce")
        if ar and key in ar:
            return int(ar[key])
    return None


def received_trace(data) -> Trace:
    """A ``rank_trace`` message's trace as it arrived: read already (columns), the error reading
    it raised, or the trace format's dict; TraceFormatError when it cannot be read."""
    if isinstance(data, Trace):
        return data
    if isinstance(data, TraceFormatError):
        raise data
    return trace_from_dict(data or {})


def rank_path(out: Path, rank: int) -> Path:
    """Where another rank's trace goes beside ``out``: ``run.json`` -> ``run.rank1.json``."""
    out = Path(out)
    return out.with_name(f"{out.stem}.rank{rank}{out.suffix or '.json'}")


def save_ranks(out: Path, shown: Trace, others: dict[int, Trace]) -> list[Path]:
    """Write ``shown`` to ``out`` and each trace of ``others`` (by rank) beside it; the paths written."""
    out = Path(out)
    shown.save(out)
    written = [out]
    for rank, trace in sorted(others.items()):
        path = rank_path(out, rank)
        trace.save(path)
        written.append(path)
    return written


def sibling_ranks(path: Path, trace: Trace) -> dict[int, Trace]:
    """The traces of the DDP run that ``trace`` (read from ``path``) belongs to, by rank, read
    from the files named beside it (``path`` itself included); empty when ``trace`` is not a
    rank of a DDP run or no other rank's file is there. A file that cannot be read, holds no
    rank, another world size or another script is left out."""
    path = Path(path)
    rank, world = rank_of(trace), world_of(trace)
    if rank is None:
        return {}
    named = _RANK_NAME.match(path.stem)
    stem = named.group("stem") if named else path.stem
    suffix = path.suffix or ".json"
    base = path.with_name(stem + suffix)
    named_ranks = [p for p in path.parent.glob(f"{glob.escape(stem)}.rank*{glob.escape(suffix)}")
                   if (m := _RANK_NAME.match(p.stem)) and m.group("stem") == stem]
    found = {rank: trace}
    for candidate in [base, *sorted(named_ranks)]:
        if candidate == path or not candidate.is_file():
            continue
        try:
            other = load_trace(candidate)
        except (TraceFormatError, OSError, UnicodeDecodeError):
            continue
        r = rank_of(other)
        if r is None or r in found or world_of(other) != world or other.script != trace.script:
            continue
        found[r] = other
    return found if len(found) > 1 else {}

