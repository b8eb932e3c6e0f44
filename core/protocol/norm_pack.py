"""``CallInfo.grad_norms`` packed for the columnar encoding (``core.protocol.columns``): the
parameter names once, ‖grad‖ and ‖param‖ (and ‖added‖ where a call added to a gradient) as the
bits of their floats (``column_pack.pack_floats``) with presence masks.

As JSON a call's norms repeat four keys and a module path per parameter and write each norm in
decimal: 262 KB on the 4,802-node example's 1,600 parameters, 76 KB of its frame once zlib has
them, paid again for every call of a training loop. Packed, what the reader can compute again to
the bit is left out: each module path (the name before its last dot), each ratio
(``grad_health.norm_ratio``) and the module norms (``grad_health.module_norms``, summed in the
parameters' order), each checked against what was recorded before it is left out and sent where
it differs. Norms that cannot be packed exactly (a key of their own, a number that is not a
float) travel as JSON, as before. The reader checks the unpacked dict as it checks the JSON one
(``core.model.trace_json``). Standard library only, for the worker.
"""

from __future__ import annotations

import math
from typing import Any

from core.model.grad_health import as_norm, module_norms, module_of, norm_ratio
from core.protocol.column_pack import b64, pack_floats, present, unpack_floats, unpack_mask, unpack_present

KEYS = ("grad", "param", "added")  # "added" is left out of a parameter that has none
SENT_WHEN_THEY_DIFFER = ("ratio", "modules")
ALWAYS = frozenset(("module", "grad", "param", "ratio"))


class NormPackError(ValueError):
    """Packed norms that do not unpack: what is wrong, for the reader's message."""


def _as_float(v):
    """A norm as the trace writes it (a float, "nan", "inf" or None) as a float or None; else raise."""
    if v is None or (type(v) is float and math.isfinite(v)):
        return v
    if v == "nan":
        return math.nan
    if v == "inf":
        return math.inf
    raise TypeError(v)


def _same(a: list, b: list) -> bool:
    """Equal as the trace writes them ("nan" equals "nan")."""
    return len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b))


def _pack_values(values: list) -> list:
    flags = present(values)  # 0.0 is a norm (a bias at zero), None is none
    kept = [v for v in values if v is not None]
    return [b64(bytes(flags)), pack_floats(kept) if kept else ""]


def _derived(grads: list, params: list, names: list[str]) -> tuple[list, list]:
    """The ratios and the (path, norm) pairs the reader computes from the grads and params."""
    if None in grads or None in params:
        return [], []
    ratios = [norm_ratio(g, p) for g, p in zip(grads, params)]
    return ratios, [(m, as_norm(n)) for m, n in module_norms(names, grads).items()]


def pack_grad_norms(norms: Any) -> dict | None:
    """``norms`` packed, or None where it cannot be packed exactly (then it travels as JSON)."""
    if not isinstance(norms, dict) or set(norms) != {"params", "modules"}:
        return None
    params, modules = norms["params"], norms["modules"]
    if not isinstance(params, dict) or not isinstance(modules, dict):
        return None
    columns: dict[str, list] = {k: [] for k in KEYS}
    ratios = []
    try:
        for name, entry in params.items():
            if type(name) is not str or type(entry) is not dict or not ALWAYS <= entry.keys() <= ALWAYS | {"added"} \
                    or entry["module"] != module_of(name) or ("added" in entry and entry["added"] is None):
                return None
            for key in KEYS:
                columns[key].append(_as_float(entry.get(key)))
            ratios.append(entry["ratio"])
            _as_float(entry["ratio"])
        pairs = list(modules.items())
        if any(type(p) is not str for p, _ in pairs):
            return None
        module_values = [_as_float(v) for _, v in pairs]
    except TypeError:
        return None
    names = list(params)
    packed = {"names": names, **{k: _pack_values(v) for k, v in columns.items()}}
    derived_ratios, derived_modules = _derived(columns["grad"], columns["param"], names)
    if not _same(derived_ratios, ratios):
        packed["ratio"] = _pack_values([_as_float(r) for r in ratios])
    if [m for m, _ in derived_modules] != [m for m, _ in pairs] or \
            not _same([n for _, n in derived_modules], [v for _, v in pairs]):
        packed["modules"] = [[m for m, _ in pairs], *_pack_values(module_values)]
    return packed


def _unpack_values(payload: Any, n: int, what: str) -> list:
    if not (isinstance(payload, list) and len(payload) == 2):
        raise NormPackError(f"'{what}': expected [presence flags, packed floats]")
    flags = unpack_mask(payload[0])
    if flags is None or len(flags) != n:
        raise NormPackError(f"'{what}': expected {n} presence flags")
    values = unpack_floats(payload[1], sum(flags)) if sum(flags) else []
    out = unpack_present(flags, values)
    if out is None:
        raise NormPackError(f"'{what}': the packed floats do not match their flags")
    return [None if v is None else as_norm(v) for v in out]


def unpack_grad_norms(packed: Any) -> dict:
    """The norms dict ``pack_grad_norms`` packed; NormPackError names what does not fit."""
    if not isinstance(packed, dict) or not {"names", *KEYS} <= packed.keys() <= {"names", *KEYS,
                                                                                  *SENT_WHEN_THEY_DIFFER}:
        raise NormPackError("expected packed norms with 'names', " + ", ".join(f"'{k}'" for k in KEYS)
                            + " and perhaps 'ratio' and 'modules'")
    names = packed["names"]
    if not isinstance(names, list) or any(type(n) is not str for n in names) or len(set(names)) != len(names):
        raise NormPackError("'names': expected distinct parameter names")
    columns = {k: _unpack_values(packed[k], len(names), k) for k in KEYS}
    grads = [_as_float(v) for v in columns["grad"]]
    params_ = [_as_float(v) for v in columns["param"]]
    derived_ratios, derived_modules = _derived(grads, params_, names)
    if "ratio" in packed:
        ratios = _unpack_values(packed["ratio"], len(names), "ratio")
    elif derived_ratios or not names:
        ratios = derived_ratios
    else:
        raise NormPackError("'ratio': missing, and a gradient or parameter norm is null")
    if "modules" in packed:
        modules = packed["modules"]
        if not (isinstance(modules, list) and len(modules) == 3 and isinstance(modules[0], list)
                and all(type(p) is str for p in modules[0]) and len(set(modules[0])) == len(modules[0])):
            raise NormPackError("'modules': expected [distinct paths, presence flags, packed floats]")
        pairs = list(zip(modules[0], _unpack_values(modules[1:], len(modules[0]), "modules")))
    elif derived_modules or not names:
        pairs = derived_modules
    else:
        raise NormPackError("'modules': missing, and a gradient norm is null")
    params = {}
    for i, name in enumerate(names):
        entry = {"module": module_of(name), "grad": columns["grad"][i], "param": columns["param"][i],
                 "ratio": ratios[i]}
        if columns["added"][i] is not None:
            entry["added"] = columns["added"][i]
        params[name] = entry
    return {"params": params, "modules": dict(pairs)}
