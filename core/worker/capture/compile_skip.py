"""The capture's own frames kept out of torch.compile (worker side, imports torch).

While a compiled function runs, TorchDynamo is called for every Python frame that starts, and
compiles each one it finds tensors in: the capture's name tracer (``sys.settrace``), its
TorchFunctionMode and the call sites that run the script's ops would each become graphs of
their own, which a plain run does not have. Every code object of the capture's modules is
marked to run as it is (``skip_code``: that frame only; what it calls is compiled as usual, and
Dynamo still traces through the creation mode where the script's compiled code calls it).

Importing Dynamo costs seconds, so the marking waits until the script has imported it
(``torch.compile`` does on its first call): ``hide_when_compiling`` at install, then
``on_import`` after each import the script makes.
"""

from __future__ import annotations

import sys
import types

PACKAGE = "core.worker"  # the worker's modules: the capture, the stepper, the memory sampler
DYNAMO = "torch._dynamo.eval_frame"
_done: set[int] = set()  # ids of the module namespaces already marked
_pending: list = []  # roots to mark once Dynamo is loaded
_providers: list = []  # callables giving code objects made at run time (the creation mode's call sites)


def register_codes(provider) -> None:
    """``provider()`` gives code objects the capture makes as it runs: marked with the rest."""
    _providers.append(provider)


def hide_when_compiling(*roots) -> None:
    """Mark the frames ``roots`` reach (``hide_worker_frames``) now if Dynamo is loaded, else as
    soon as an import loads it (``on_import``)."""
    _pending.extend(roots)
    on_import()


def on_import() -> None:
    """Called after each import of the script's: marks the pending roots once Dynamo is loaded."""
    if _pending and _dynamo_loaded():
        roots = list(_pending)
        _pending.clear()
        hide_worker_frames(*roots)


def _dynamo_loaded() -> bool:
    """Whether Dynamo's eval_frame module is loaded and done loading (an import made while it
    is still running its own imports sees it half made)."""
    module = sys.modules.get(DYNAMO)
    return (module is not None and hasattr(module, "skip_code")
            and not getattr(getattr(module, "__spec__", None), "_initializing", False))


def _skip_code():
    try:
        from torch._dynamo.eval_frame import skip_code
    except ImportError:  # a torch without Dynamo: nothing to hide from
        return None
    return skip_code


def hide_code(code: types.CodeType) -> None:
    """Mark ``code`` and the code nested in it (closures, lambdas, comprehensions) as never compiled
    (nothing to do until Dynamo is loaded: ``hide_when_compiling`` marks what exists by then)."""
    if not _dynamo_loaded():
        return
    skip_code = _skip_code()
    if skip_code is None:
        return
    stack = [code]
    while stack:
        c = stack.pop()
        try:
            skip_code(c)
        except Exception:
            return
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))


def hide_worker_frames(*roots) -> None:
    """Mark every function of the worker's modules that ``roots`` (classes, functions, modules)
    reach through the globals of their functions. The worker's modules leave ``sys.modules`` while
    the script runs (``core.worker.env``), so they are found from what the capture holds."""
    if not _dynamo_loaded() or _skip_code() is None:
        return
    for provider in _providers:
        for code in provider():
            hide_code(code)
    stack = [vars(r) if isinstance(r, types.ModuleType) else _globals_of(r) for r in roots]
    while stack:
        namespace = stack.pop()
        if namespace is None or id(namespace) in _done:
            continue
        _done.add(id(namespace))
        for value in list(namespace.values()):
            if isinstance(value, types.ModuleType):
                if _ours(getattr(value, "__name__", "")):
                    stack.append(vars(value))
                continue
            for fn in _functions(value):
                hide_code(fn.__code__)
                stack.append(fn.__globals__)


def _ours(module_name) -> bool:
    return isinstance(module_name, str) and (module_name == PACKAGE or module_name.startswith(PACKAGE + "."))


def _globals_of(obj) -> dict | None:
    for fn in _functions(obj):
        return fn.__globals__
    return None


def _functions(value):
    """The functions ``value`` is or defines, where it is one of the worker's own."""
    if isinstance(value, types.FunctionType):
        if _ours(value.__module__):
            yield value
    elif isinstance(value, type) and _ours(value.__module__):
        for attr in vars(value).values():
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            elif isinstance(attr, property):
                for f in (attr.fget, attr.fset, attr.fdel):
                    if isinstance(f, types.FunctionType):
                        yield f
                continue
            if isinstance(attr, types.FunctionType):
                yield attr
