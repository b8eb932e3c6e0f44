"""Where a script touches memory on purpose: ``zero_grad``, ``optimizer.step`` and ``empty_cache``.

Runs in the worker while a script runs. Each call becomes a marked memory sample (``mark`` is
the event, ``where`` its script line), so the chart draws a labelled line where it happened.
``optimizer.step`` uses torch's global step hook; ``zero_grad`` (optimizers and modules) and
``torch.cuda.empty_cache`` have no hook, so they are wrapped for the run and restored after.
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Callable

log = logging.getLogger(__name__)


def describe_node(node, line: int | None, module: str | None = None) -> str:
    """``"AddmmBackward0 · line 18 · fc1"``: what a sample's ``where`` says about the op that ran."""
    parts = [node.name() if hasattr(node, "name") else type(node).__name__]
    if line:
        parts.append(f"line {line}")
    if module:
        parts.append(module)
    return " · ".join(parts)


def install_marks(note: Callable[[str, str], object], line_of: Callable[[], int | None]) -> Callable[[], None]:
    """Call ``note(kind, where)`` at each ``zero_grad`` / ``optimizer.step`` / ``empty_cache``.

    ``line_of()`` gives the script line running now. Returns a function that removes it all.
    """
    import torch

    undo: list[Callable[[], None]] = []

    def where() -> str:
        try:
            line = line_of()
        except Exception:
            line = None
        return f"line {line}" if line else ""

    def safe_note(kind: str) -> None:
        try:
            note(kind, where())
        except Exception:  # a marker must never break the script
            log.debug("memory mark %s failed", kind, exc_info=True)

    def wrap(owner, attr: str, kind: str) -> None:
        original = getattr(owner, attr, None)
        if original is None:
            return

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            safe_note(kind)
            return result

        setattr(owner, attr, wrapper)
        undo.append(lambda: setattr(owner, attr, original))

    wrap(torch.optim.Optimizer, "zero_grad", "zero_grad")
    wrap(torch.nn.Module, "zero_grad", "zero_grad")
    wrap(torch.cuda, "empty_cache", "empty_cache")
    # Optimizers override ``step``, so the base class cannot be wrapped: torch's global hook fires for all.
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(lambda opt, args, kwargs: safe_note("optimizer.step"))
    undo.append(handle.remove)

    def remove() -> None:
        for fn in reversed(undo):
            try:
                fn()
            except Exception:
                log.debug("removing a memory mark failed", exc_info=True)
        undo.clear()

    return remove


def script_line(names) -> Callable[[], int | None]:
    """The current script line, for ``install_marks``: the innermost frame in the user's file."""
    return lambda: names.user_line(sys._getframe(1))
