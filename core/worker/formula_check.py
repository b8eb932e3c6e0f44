"""Evaluate a node's formula from ``core.model.formulas`` on the node's own saved values (torch side).

Used by the tests to prove each shown formula equals what ``torch.autograd.grad`` computes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from core.model.formulas import FORMULAS


def keep_dims(t: torch.Tensor, dim, keepdim: bool) -> torch.Tensor:
    """Put back the dims a reduction without keepdim removed."""
    if keepdim:
        return t
    dims = [dim] if isinstance(dim, int) else list(dim)
    for d in sorted(d % (t.dim() + len(dims)) for d in dims):
        t = t.unsqueeze(d)
    return t


def inverse(dims) -> list[int]:
    out = [0] * len(dims)
    for i, d in enumerate(dims):
        out[d] = i
    return out


def n_of(t: torch.Tensor, reduction: int) -> int:
    return t.numel() if reduction == 1 else 1


def layer_norm_input(grad, x, weight, mean, rstd):
    xhat = (x - mean) * rstd
    g = grad * weight
    return rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))


def batch_norm_input(grad, x, weight, mean, invstd):
    xhat = (x - mean) * invstd
    g = grad * weight
    return invstd * (g - g.mean(0) - xhat * (g * xhat).mean(0))


_HELPERS = dict(torch=torch, F=F, math=math, keep_dims=keep_dims, inverse=inverse, n_of=n_of,
                layer_norm_input=layer_norm_input, batch_norm_input=batch_norm_input)


def saved_values(node) -> dict:
    return {a[len("_saved_"):]: getattr(node, a) for a in dir(node) if a.startswith("_saved_")}


def evaluate(node, grad: torch.Tensor) -> list[torch.Tensor | None]:
    """Each input's gradient by the formula (None where the rule has no check expression)."""
    formula = FORMULAS[node.name()]
    env = dict(_HELPERS)
    env.update(saved_values(node))
    env["grad"] = grad
    out = []
    rules = list(formula.rules)
    if rules and "*" in rules[0].input:
        rules = rules * len(node.next_functions)
    for i, rule in enumerate(rules):
        if rule.check is None:
            out.append(None)
            continue
        env["i"] = i
        out.append(eval(rule.check, env))  # noqa: S307 - expressions from our own table
    return out
