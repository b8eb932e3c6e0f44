"""Cut inputs: why an entry of ``next_functions`` is None (worker side, imports torch).

A None entry is an input through which no gradient flows: a constant, a ``detach()``ed
tensor, a value computed under ``torch.no_grad()``, a Python number (for instance one taken
out with ``.item()``). The graph alone cannot say which; so capture notes, per op, the
inputs that need no gradient (``note_inputs``, stored in the new node's metadata) and the
tensors made by ``detach()`` or under ``no_grad`` (``note_free``, kept in a weak table), the
numbers ``.item()`` returned with the script's words for them (``note_item``), and the walk
matches those notes to the None entries (``cuts_of``).
"""

from __future__ import annotations

import ast
import functools
import linecache
import re
import sys
import weakref
from typing import Callable

import torch

from core.model.causes import CUT_WORDS as CAUSE_TEXT

_NUMBERS = (int, float)
# How many numbers taken out with ``.item()`` are remembered (the latest ones: a script passes a
# number to an op soon after it took it out).
_ITEMS_KEPT = 256


class CutRecorder:
    """Remembers how the script made tensors that carry no gradient."""

    def __init__(self):
        # id(tensor) -> (weak reference, origin). A plain dict: it is read on every op that makes a
        # tensor without gradient, and a WeakIdKeyDictionary lookup builds a Python object per key.
        self.origins: dict[int, tuple[weakref.ref, str]] = {}
        # id(number) -> (the number, its source text): the numbers ``.item()`` returned. The number
        # itself is held, so the id stays its own; small ints are shared objects and not kept.
        self.items: dict[int, tuple[object, str | None]] = {}
        self._is_user_file: Callable[[str], bool] | None = None  # set by the first ``note_item``

    def _set(self, t: torch.Tensor, origin: str) -> None:
        key, origins = id(t), self.origins

        def gone(ref, key=key, origins=origins):
            entry = origins.get(key)
            if entry is not None and entry[0] is ref:
                del origins[key]

        try:
            origins[key] = (weakref.ref(t, gone), origin)
        except TypeError:
            pass

    def note_free(self, out: torch.Tensor, op: str, args) -> None:
        """``out`` has no grad_fn: remember it if ``detach()`` or ``no_grad`` cut it off."""
        if op == "detach":
            if args and isinstance(args[0], torch.Tensor) and args[0].requires_grad:
                self._set(out, "detach")
        elif args and out is args[0]:
            return
        elif not torch.is_grad_enabled():
            for a in args:
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    self._set(out, "no_grad")
                    return
        if len(self.origins):
            # Computed from a cut-off tensor: ``x.detach() * 10`` is as detached as ``x.detach()``.
            for a in args:
                if isinstance(a, torch.Tensor):
                    origin = self.origin(a)
                    if origin is not None:
                        self._set(out, origin)
                        return

    def origin(self, t: torch.Tensor) -> str | None:
        """'detach' or 'no_grad' for a tensor cut off by either, else None."""
        entry = self.origins.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        return None

    def note_item(self, value, frame, is_user_file: Callable[[str], bool]) -> None:
        """``value`` was returned by ``.item()`` called from ``frame``: remember it with the
        script's text for it (``scale = (x.sum() * 2).item()``) when the call is the script's."""
        if type(value) is bool or (type(value) is int and -5 <= value <= 256):
            return
        self._is_user_file = is_user_file
        text = item_source(frame) if frame is not None and is_user_file(frame.f_code.co_filename) else None
        items = self.items
        if len(items) >= _ITEMS_KEPT:
            del items[next(iter(items))]
        items[id(value)] = (value, text)

    def _made_from_item(self, number: float) -> str | None:
        """The script's assignment that made ``number`` from an ``.item()`` call
        (``as_number = x.item() * 10``), found by the variable of the op's caller that holds
        this very number; None when there is none."""
        is_user_file = self._is_user_file
        frame = sys._getframe(2)
        while frame is not None and not is_user_file(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is None:
            return None
        names = [k for k, v in frame.f_locals.items() if v is number]
        if not names and frame.f_globals is not frame.f_locals:
            names = [k for k, v in frame.f_globals.items() if v is number]
        if len(names) != 1:
            return None
        linecache.checkcache(frame.f_code.co_filename)
        made = _item_assignments("".join(linecache.getlines(frame.f_code.co_filename))).get(names[0], ())
        before = [text for line, text in made if line <= frame.f_lineno]
        return before[-1] if before else None

    def note_inputs(self, metadata: dict, args) -> None:
        """Store in a new node's metadata the inputs of its op that need no gradient."""
        found = []
        for a in _flat(args):
            if isinstance(a, torch.Tensor):
                if not a.requires_grad:
                    cause = self.origin(a) or ("constant" if a.is_floating_point() or a.is_complex() else "integer")
                    found.append((cause, weakref.ref(a), _short(a)))
            elif isinstance(a, _NUMBERS) and not isinstance(a, bool):
                shown = f"{a:g}" if isinstance(a, float) else str(a)
                item = self.items.get(id(a)) if self.items else None
                if item is not None and item[0] is a:
                    found.append(("item", None, shown, item[1]))
                elif self.items and isinstance(a, float) and (text := self._made_from_item(a)) is not None:
                    found.append(("item", None, shown, text))
                else:
                    found.append(("number", None, shown))
        if found:
            metadata["bps_cuts"] = found


def _flat(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def _short(t: torch.Tensor) -> str:
    try:
        if t.numel() == 1:
            return f"tensor({t.item():g})"
        return "[" + ", ".join(str(s) for s in t.shape) + "] tensor"
    except Exception:  # a nested tensor, or a tensor subclass whose shape or item raises
        return "tensor"


def cuts_of(nxt: list, notes, name_of: Callable[[torch.Tensor], str | None]) -> list[dict]:
    """Match the notes of an op to the None entries of its node's next functions.

    Returns one dict per None entry: ``input`` (its position), ``cause`` (a key of
    ``CAUSE_TEXT``, or None when unknown), ``name`` (the script's name; for a number taken out
    with ``.item()``, the script's text of that call, ``scale = (x.sum() * 2).item()``) and
    ``value``.
    """
    nones = [i for i, e in enumerate(nxt) if e is None]
    if not nones:
        return []
    notes = list(notes or ())
    # Integer tensors (targets, indices) are often not inputs of the node at all; numbers likewise.
    floats = [n for n in notes if n[0] != "integer"]
    for pick in (notes, floats, [n for n in floats if n[0] != "number"], [n for n in notes if n[0] == "number"]):
        if len(pick) == len(nones):
            break
    else:
        pick = []
    out = []
    for k, i in enumerate(nones):
        if k < len(pick):
            cause, ref, value = pick[k][:3]
            t = ref() if ref is not None else None
            name = pick[k][3] if cause == "item" else name_of(t) if t is not None else None
            out.append({"input": i, "cause": cause, "name": name, "value": value})
        else:
            out.append({"input": i, "cause": None, "name": None, "value": None})
    return out


_item_texts: dict[tuple, str | None] = {}


def item_source(frame) -> str | None:
    """The script's text of the ``.item()`` call ``frame`` is making: the call expression, with
    the assignment target when the statement assigns just that (``scale = (x.sum() * 2).item()``).
    None where the source or the call's position is unknown. Kept per call site."""
    code, at = frame.f_code, frame.f_lasti
    key = (code, at)
    if key in _item_texts:
        return _item_texts[key]
    try:
        _, end_line, _, end_col = list(code.co_positions())[at // 2]
        linecache.checkcache(code.co_filename)  # the file as this run compiled it
        text = _item_calls("".join(linecache.getlines(code.co_filename))).get((end_line, end_col))
    except Exception:  # no positions (python -X no_debug_ranges), or the file is gone
        text = None
    if len(_item_texts) > 4096:
        _item_texts.clear()
    _item_texts[key] = text
    return text


@functools.lru_cache(maxsize=16)
def _item_calls(source: str) -> dict[tuple, str]:
    """(end line, end column) -> the script's text of every ``.item()`` call of a source file,
    parsed once.

    A call is found by where it ends: Python 3.11 places a call that spans lines at its last
    line only (``.item()``), while its end is that of the whole expression."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    targets = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            names = node.targets if isinstance(node, ast.Assign) else [node.target]
            targets[id(node.value)] = " = ".join(map(ast.unparse, names))
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "item" \
                and not node.args and not node.keywords:
            text = _one_line(ast.get_source_segment(source, node) or "")
            if not text:
                continue
            target = targets.get(id(node))
            # columns count UTF-8 bytes in both the tree and the code's positions
            out[(node.end_lineno, node.end_col_offset)] = f"{target} = {text}" if target else text
    return out


@functools.lru_cache(maxsize=16)
def _item_assignments(source: str) -> dict[str, list[tuple[int, str]]]:
    """name -> (line, text) of each assignment of a source file to that plain name from an
    expression that calls ``.item()`` (``as_number = x.item() * 10``), in line order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    out: dict[str, list[tuple[int, str]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if len(targets) != 1 or not isinstance(targets[0], ast.Name):
                continue
            if any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "item"
                   for c in ast.walk(node.value)):
                text = _one_line(ast.get_source_segment(source, node.value) or "")
                out.setdefault(targets[0].id, []).append((node.lineno, f"{targets[0].id} = {text}"))
    for found in out.values():
        found.sort()
    return out


def _one_line(text: str) -> str:
    """Source text over several lines as one line, without the spaces the line breaks left inside
    brackets: ``(x.sum() * 2).item()``."""
    if "\n" not in text:
        return text  # as the script wrote it
    return re.sub(r" ([)\]}])", r"\1", re.sub(r"([(\[{]) ", r"\1", " ".join(text.split())))


def hook_names(hooks) -> list[str]:
    """The hooks registered on a tensor (``Tensor.register_hook``), as 'name (line N)'."""
    out = []
    for fn in list(hooks.values()):
        if getattr(fn, "_bps_internal", False):
            continue  # the app's own hook (the DDP watch of core.worker.ddp_rank), not the script's
        code = getattr(fn, "__code__", None)
        name = getattr(fn, "__qualname__", None) or type(fn).__name__
        out.append(f"{name} (line {code.co_firstlineno})" if code is not None else name)
    return out
