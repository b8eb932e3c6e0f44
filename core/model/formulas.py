"""Local derivative formulas of autograd's backward nodes, in plain math (no torch import).

Each backward node applies one local rule: given ``grad`` (the gradient arriving from its
output) and what forward saved, it returns one gradient per input, in the order of its
``next_functions``. ``formula_lines`` writes that rule with the script's names substituted
(``MulBackward0`` for ``c = a * b`` reads ``grad_a = grad_c · b``).

Every rule that is an expression of the node's saved values also carries ``check``: the same
rule as a Python expression over ``grad``, the saved values (by their ``_saved_`` name),
``torch``, ``F`` (``torch.nn.functional``), ``math`` and the functions of
``core.worker.formula_check``. The tests evaluate those expressions on random inputs and compare
them with ``torch.autograd.grad``, so the text shown to a student is the rule the engine runs.

Hand-written: PyTorch's own ``derivatives.yaml`` is not shipped with the wheel and is written
in C++ expressions a student cannot read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """The gradient one input receives. ``input`` is the argument name; ``*`` in it means
    'one per listed tensor' (cat, stack), with ``i`` bound to the position in ``check``."""

    input: str
    math: str
    check: str | None = None


@dataclass(frozen=True)
class Formula:
    node: str
    rules: tuple[Rule, ...]
    note: str = ""


_BCAST = "summed back to each input's shape where it was broadcast"

_TABLE: list[Formula] = []


def _f(node: str, *rules: tuple, note: str = "") -> None:
    _TABLE.append(Formula(node, tuple(Rule(*r) for r in rules), note))


# arithmetic
_f("AddBackward0", ("self", "grad", "grad"), ("other", "grad · alpha", "grad * alpha"), note=_BCAST)
_f("SubBackward0", ("self", "grad", "grad"), ("other", "−grad · alpha", "-grad * alpha"), note=_BCAST)
_f("RsubBackward1", ("self", "−grad · alpha", "-grad * alpha"))
_f("MulBackward0", ("self", "grad · other", "grad * other"), ("other", "grad · self", "grad * self"), note=_BCAST)
_f("DivBackward0", ("self", "grad / other", "grad / other"),
   ("other", "−grad · self / other²", "-grad * self / other**2"), note=_BCAST)
_f("NegBackward0", ("self", "−grad", "-grad"))
_f("ReciprocalBackward0", ("self", "−grad · result²", "-grad * result**2"))
_f("PowBackward0", ("self", "grad · exponent · self^(exponent − 1)", "grad * exponent * self**(exponent - 1)"))
_f("PowBackward1", ("self", "grad · exponent · self^(exponent − 1)", "grad * exponent * self**(exponent - 1)"),
   ("exponent", "grad · result · log(self)", "grad * result * torch.log(self)"), note=_BCAST)
_f("AbsBackward0", ("self", "grad · sign(self)", "grad * torch.sign(self)"))
_f("ClampBackward1", ("self", "grad where min ≤ self ≤ max, else 0", "grad * ((self >= min) & (self <= max))"))
# exp / log and pointwise functions
_f("ExpBackward0", ("self", "grad · result", "grad * result"), note="result = exp(self): exp is its own derivative")
_f("LogBackward0", ("self", "grad / self", "grad / self"))
_f("SqrtBackward0", ("self", "grad / (2 · result)", "grad / (2 * result)"))
_f("SinBackward0", ("self", "grad · cos(self)", "grad * torch.cos(self)"))
_f("CosBackward0", ("self", "−grad · sin(self)", "-grad * torch.sin(self)"))
_f("ReluBackward0", ("self", "grad · [result > 0]", "grad * (result > 0)"),
   note="the gradient passes where the output was positive and stops elsewhere")
_f("SigmoidBackward0", ("self", "grad · result · (1 − result)", "grad * result * (1 - result)"))
_f("TanhBackward0", ("self", "grad · (1 − result²)", "grad * (1 - result**2)"))
_f("GeluBackward0", ("self", "grad · (Φ(self) + self · φ(self))",
                     "grad * (0.5 * (1 + torch.erf(self / math.sqrt(2))) + self * torch.exp(-self**2 / 2) "
                     "/ math.sqrt(2 * math.pi))"),
   note="Φ, φ: the standard normal CDF and density (approximate='none')")
_f("LeakyReluBackward0", ("self", "grad · (1 if self > 0 else negative_slope)",
                          "grad * torch.where(self > 0, 1.0, negative_slope)"))
_f("SiluBackward0", ("self", "grad · σ(self) · (1 + self · (1 − σ(self)))",
                     "grad * torch.sigmoid(self) * (1 + self * (1 - torch.sigmoid(self)))"))
_f("SoftplusBackward0", ("self", "grad · σ(beta · self)", "grad * torch.sigmoid(beta * self)"),
   note="where beta · self ≤ threshold; above it softplus is the identity")
_f("SoftmaxBackward0", ("self", "result · (grad − Σ_dim(grad · result))",
                        "result * (grad - (grad * result).sum(dim, keepdim=True))"))
_f("LogSoftmaxBackward0", ("self", "grad − exp(result) · Σ_dim grad",
                           "grad - torch.exp(result) * grad.sum(dim, keepdim=True)"))
_f("LinalgVectorNormBackward0", ("self", "grad · self / result", "grad * self / result"), note="ord = 2")
# matrix products
_f("MmBackward0", ("self", "grad @ mat2ᵀ", "grad @ mat2.T"), ("mat2", "selfᵀ @ grad", "self.T @ grad"))
_f("MvBackward0", ("self", "grad ⊗ vec (outer product)", "torch.outer(grad, vec)"),
   ("vec", "selfᵀ @ grad", "self.T @ grad"))
_f("AddmmBackward0", ("self", "beta · grad, summed over the batch", "beta * grad"),
   ("mat1", "alpha · grad @ mat2ᵀ", "alpha * grad @ mat2.T"),
   ("mat2", "alpha · mat1ᵀ @ grad", "alpha * mat1.T @ grad"),
   note="nn.Linear: self is the bias, mat1 the input, mat2 the weight transposed")
_f("BmmBackward0", ("self", "grad @ mat2ᵀ (per batch)", "grad @ mat2.transpose(1, 2)"),
   ("mat2", "selfᵀ @ grad (per batch)", "self.transpose(1, 2) @ grad"))
# shape and layout
_f("TBackward0", ("self", "gradᵀ", "grad.t()"))
_f("TransposeBackward0", ("self", "grad with dims dim0 and dim1 swapped back", "grad.transpose(dim0, dim1)"))
_f("PermuteBackward0", ("self", "grad permuted by the inverse of dims", "grad.permute(*inverse(dims))"))
_f("ViewBackward0", ("self", "grad reshaped to self_sym_sizes", "grad.reshape(self_sym_sizes)"))
_f("UnsafeViewBackward0", ("self", "grad reshaped to self_sym_sizes", "grad.reshape(self_sym_sizes)"))
_f("ReshapeAliasBackward0", ("self", "grad reshaped to self_sym_sizes", "grad.reshape(self_sym_sizes)"))
_f("ExpandBackward0", ("self", "grad summed over the expanded dims, back to self_sym_sizes",
                       "grad.sum_to_size(self_sym_sizes)"),
   note="a broadcast in forward is a sum in backward")
_f("UnsqueezeBackward0", ("self", "grad with dim removed", "grad.squeeze(dim)"))
_f("SqueezeBackward0", ("self", "grad reshaped to self_sym_sizes", "grad.reshape(self_sym_sizes)"))
_f("SqueezeBackward1", ("self", "grad reshaped to self_sym_sizes", "grad.reshape(self_sym_sizes)"))
_f("CloneBackward0", ("self", "grad", "grad"))
_f("ToCopyBackward0", ("self", "grad, cast back to the input's dtype and device", "grad"))
# reductions
_f("SumBackward0", ("self", "grad copied to every element (expand to self_sym_sizes)",
                    "grad.expand(self_sym_sizes)"))
_f("SumBackward1", ("self", "grad copied along dim (expand to self_sym_sizes)",
                    "keep_dims(grad, dim, keepdim).expand(self_sym_sizes)"))
_f("MeanBackward0", ("self", "grad / self_sym_numel, copied to every element",
                     "grad.expand(self_sym_sizes) / self_sym_numel"))
_f("MeanBackward1", ("self", "grad / N copied along dim (N: the elements averaged)",
                     "keep_dims(grad, dim, keepdim).expand(self_sym_sizes) * grad.numel() / self_sym_numel"))
_f("MaxBackward0", ("self", "grad at the positions in indices, 0 elsewhere",
                    "torch.zeros(self_sym_sizes, dtype=grad.dtype).scatter("
                    "dim, keep_dims(indices, dim, keepdim), keep_dims(grad, dim, keepdim))"))
_f("MaxBackward1", ("self", "grad shared evenly by the elements equal to result",
                    "grad * (self == result) / (self == result).sum()"))
# losses
_f("NllLossBackward0", ("self", "−grad · weight[target] / total_weight at [i, target_i], 0 elsewhere",
                        "-F.one_hot(target, self.shape[-1]).to(self.dtype) * grad "
                        "/ (total_weight if reduction == 1 else 1)"),
   note="reduction 'sum' leaves out the division; rows with target = ignore_index get 0")
_f("MseLossBackward0",
   ("self", "2 · (self − target) · grad / N", "2 * (self - target) * grad / n_of(self, reduction)"),
   ("target", "−2 · (self − target) · grad / N", "-2 * (self - target) * grad / n_of(self, reduction)"),
   note="N: the number of elements with reduction 'mean', 1 with 'sum'")
_f("BinaryCrossEntropyWithLogitsBackward0",
   ("self", "(σ(self) − target) · grad / N", "(torch.sigmoid(self) - target) * grad / n_of(self, reduction)"),
   ("target", "−self · grad / N", "-self * grad / n_of(self, reduction)"),
   note="N: the number of elements with reduction 'mean'; without weight and pos_weight")
# layers
_f("ConvolutionBackward0",
   ("input", "grad convolved with weight, transposed (conv_transpose)",
    "torch.nn.grad.conv2d_input(input.shape, weight, grad, stride, padding, dilation, groups)"),
   ("weight", "input correlated with grad", 
    "torch.nn.grad.conv2d_weight(input, weight.shape, grad, stride, padding, dilation, groups)"),
   ("bias", "Σ grad over batch and positions", "grad.sum((0, 2, 3))"),
   note="checked for 2-D convolutions")
_f("NativeLayerNormBackward0",
   ("input",
    "result2 · (g − mean(g) − x̂ · mean(g · x̂)), g = grad · weight, x̂ = (input − result1) · result2",
    "layer_norm_input(grad, input, weight, result1, result2)"),
   ("weight", "Σ grad · x̂ over the batch", "(grad * (input - result1) * result2).sum_to_size(weight.shape)"),
   ("bias", "Σ grad over the batch", "grad.sum_to_size(bias.shape)"),
   note="result1: the mean, result2: 1 / standard deviation, per row")
_f("NativeBatchNormBackward0",
   ("input", "result2 · (g − mean(g) − x̂ · mean(g · x̂)) over the batch, g = grad · weight",
    "batch_norm_input(grad, input, weight, result1, result2)"),
   ("weight", "Σ grad · x̂ over the batch", "(grad * (input - result1) * result2).sum(0)"),
   ("bias", "Σ grad over the batch", "grad.sum(0)"),
   note="training mode; result1: batch mean, result2: 1 / batch standard deviation; checked on [N, C]")
_f("EmbeddingBackward0", ("weight", "rows of grad added into the rows named by indices",
                          "torch.zeros(weight_sym_argsize_0, grad.shape[-1], dtype=grad.dtype)"
                          ".index_add(0, indices.reshape(-1), grad.reshape(-1, grad.shape[-1]))"))
# indexing and joining
_f("IndexBackward0", ("self", "zeros of self_sym_sizes with grad added at indices",
                      "torch.zeros(self_sym_sizes, dtype=grad.dtype).index_put(tuple(indices), grad, accumulate=True)"))
_f("SelectBackward0", ("self", "zeros of self_sym_sizes with grad at index along dim",
                       "torch.zeros(self_sym_sizes, dtype=grad.dtype).select_scatter(grad, dim, index)"))
_f("SliceBackward0", ("self", "zeros of self_sym_sizes with grad in start:end:step along dim",
                      "torch.zeros(self_sym_sizes, dtype=grad.dtype).slice_scatter(grad, dim, start, end, step)"))
_f("CatBackward0", ("tensors[*]", "the slice of grad along dim that tensor i filled", None))
_f("StackBackward0", ("tensors[*]", "grad.select(dim, i)", "grad.select(dim, i)"))
_f("SplitBackward0", ("self", "the grads of all pieces, concatenated along dim (zeros for unused pieces)", None))
_f("SplitWithSizesBackward0", ("self", "the grads of all pieces, concatenated along dim", None))
_f("UnbindBackward0", ("self", "the grads of all outputs, stacked along dim (zeros for unused ones)", None))
_f("WhereBackward0", ("self", "grad where condition, else 0", "torch.where(condition, grad, 0.0)"),
   ("other", "grad where not condition, else 0", "torch.where(condition, 0.0, grad)"))
_f("AccumulateGrad", ("variable", "variable.grad += grad (or variable.grad = grad when it is None)", None),
   note="no local derivative: it adds the arriving gradient into the leaf's .grad")

FORMULAS: dict[str, Formula] = {f.node: f for f in _TABLE}

# A rule for this input is a statement about the leaf (AccumulateGrad), not a gradient sent on:
# it is written without a ``grad_<input> =`` in front, and ``variable`` is the leaf's name.
_STATEMENT_INPUT = "variable"


def formula_for(node_name: str) -> Formula | None:
    """The formula of a backward node type, or None when it is not in the table."""
    return FORMULAS.get(node_name)


def formula_lines(node_name: str, names: dict[str, str] | None = None, inputs: list[str | None] | None = None,
                  output: str | None = None) -> list[str]:
    """The node's rules as lines of plain math with the script's names.

    ``names`` maps saved-value names (``self``, ``other``) to the script's names (``a``, ``b``);
    ``inputs`` are the script's names of the tensors feeding each input, in next_functions
    order; ``output`` names the tensor the node made (``grad`` is then ``grad_<output>`` and
    ``result`` is ``output``).
    """
    formula = FORMULAS.get(node_name)
    if formula is None:
        return []
    subst = dict(names or {})
    if output:
        subst.setdefault("result", output)
        subst.setdefault(_STATEMENT_INPUT, output)
        subst["grad"] = f"grad_{output}"
    # Whole names only: not an attribute (the ``grad`` of ``x.grad``), not part of a longer
    # identifier (``self_sym_sizes``); a mark such as ``ᵀ`` or ``²`` may follow the name.
    pattern = re.compile(r"(?<![A-Za-z0-9_.])(" + "|".join(map(re.escape, sorted(subst, key=len, reverse=True)))
                         + r")(?![A-Za-z0-9_])") if subst else None
    lines = []
    inputs = list(inputs or [])
    rules = list(formula.rules)
    if rules and "*" in rules[0].input:
        rules = [Rule(rules[0].input.replace("*", str(i)), rules[0].math.replace("dim, i)", f"dim, {i})"))
                 for i in range(max(len(inputs), 1))]
    for i, rule in enumerate(rules):
        math_text = pattern.sub(lambda m: subst[m.group(1)], rule.math) if pattern else rule.math
        if rule.input == _STATEMENT_INPUT:
            lines.append(math_text)
            continue
        who = inputs[i] if i < len(inputs) and inputs[i] else subst.get(rule.input, rule.input)
        lhs = f"grad_{rule.input}" if who == rule.input else f"grad_{rule.input} ({who})"
        lines.append(f"{lhs} = {math_text}")
    return lines
