"""The derivative formulas shown in the inspector equal what torch.autograd.grad computes."""

import pytest
import torch
import torch.nn.functional as F

from core.worker.formula_check import evaluate
from core.model.formulas import FORMULAS, formula_lines

torch.manual_seed(0)


def r(*shape, positive=False):
    t = torch.randn(*shape, dtype=torch.float64)
    if positive:
        t = t.abs() + 0.5
    return t.requires_grad_()


def _cases():
    a, b, m, v = r(3, 4), r(3, 4), r(4, 5), r(4)
    p, q = r(3, 4, positive=True), r(3, 4, positive=True)
    b1, b2 = r(2, 3, 4), r(2, 4, 5)
    bias, small = r(5), r(1, 4)
    img, kernel, kb = r(1, 2, 5, 5), r(3, 2, 3, 3), r(3)
    w4, c4 = r(4), r(4)
    emb = r(6, 3)
    idx = torch.tensor([0, 2, 2])
    target = torch.tensor([0, 3, 1])
    prob = torch.rand(3, 4, dtype=torch.float64)
    mid = a * 1.0
    return [
        ("AddBackward0", lambda: a + small, [a, small]),
        ("SubBackward0", lambda: a - b, [a, b]),
        ("RsubBackward1", lambda: 1 - a, [a]),
        ("MulBackward0", lambda: a * b, [a, b]),
        ("DivBackward0", lambda: a / q, [a, q]),
        ("NegBackward0", lambda: -a, [a]),
        ("ReciprocalBackward0", lambda: p.reciprocal(), [p]),
        ("PowBackward0", lambda: a**3, [a]),
        ("PowBackward1", lambda: p**b, [p, b]),
        ("AbsBackward0", lambda: a.abs(), [a]),
        ("ClampBackward1", lambda: a.clamp(-0.5, 0.5), [a]),
        ("ExpBackward0", lambda: a.exp(), [a]),
        ("LogBackward0", lambda: p.log(), [p]),
        ("SqrtBackward0", lambda: p.sqrt(), [p]),
        ("SinBackward0", lambda: a.sin(), [a]),
        ("CosBackward0", lambda: a.cos(), [a]),
        ("ReluBackward0", lambda: a.relu(), [a]),
        ("SigmoidBackward0", lambda: a.sigmoid(), [a]),
        ("TanhBackward0", lambda: a.tanh(), [a]),
        ("GeluBackward0", lambda: F.gelu(a), [a]),
        ("LeakyReluBackward0", lambda: F.leaky_relu(a, 0.1), [a]),
        ("SiluBackward0", lambda: F.silu(a), [a]),
        ("SoftplusBackward0", lambda: F.softplus(a, beta=2.0), [a]),
        ("SoftmaxBackward0", lambda: a.softmax(1), [a]),
        ("LogSoftmaxBackward0", lambda: a.log_softmax(0), [a]),
        ("LinalgVectorNormBackward0", lambda: a.norm(), [a]),
        ("MmBackward0", lambda: a @ m, [a, m]),
        ("MvBackward0", lambda: a @ v, [a, v]),
        ("AddmmBackward0", lambda: F.linear(a, m.t(), bias), [bias, a, m]),
        ("BmmBackward0", lambda: torch.bmm(b1, b2), [b1, b2]),
        ("TBackward0", lambda: a.t(), [a]),
        ("TransposeBackward0", lambda: b1.transpose(0, 2), [b1]),
        ("PermuteBackward0", lambda: b1.permute(2, 0, 1), [b1]),
        ("ViewBackward0", lambda: a.view(2, 6), [a]),
        ("UnsafeViewBackward0", lambda: torch.ops.aten._unsafe_view(mid, [12]), [mid]),
        ("ExpandBackward0", lambda: v.expand(3, 4), [v]),
        ("UnsqueezeBackward0", lambda: a.unsqueeze(1), [a]),
        ("SqueezeBackward1", lambda: small.squeeze(0), [small]),
        ("CloneBackward0", lambda: a.clone(), [a]),
        ("SumBackward0", lambda: a.sum(), [a]),
        ("SumBackward1", lambda: b1.sum(1), [b1]),
        ("MeanBackward0", lambda: a.mean(), [a]),
        ("MeanBackward1", lambda: b1.mean((0, 2), keepdim=True), [b1]),
        ("MaxBackward0", lambda: a.max(1)[0], [a]),
        ("MaxBackward1", lambda: a.max(), [a]),
        ("NllLossBackward0", lambda: F.nll_loss(a, target), [a]),
        ("MseLossBackward0", lambda: F.mse_loss(a, b), [a, b]),
        ("BinaryCrossEntropyWithLogitsBackward0",
         lambda: F.binary_cross_entropy_with_logits(a, prob.requires_grad_()), [a, prob]),
        ("ConvolutionBackward0", lambda: F.conv2d(img, kernel, kb, stride=2, padding=1), [img, kernel, kb]),
        ("NativeLayerNormBackward0", lambda: F.layer_norm(a, (4,), w4, c4), [a, w4, c4]),
        ("NativeBatchNormBackward0", lambda: F.batch_norm(a, None, None, w4, c4, training=True), [a, w4, c4]),
        ("EmbeddingBackward0", lambda: F.embedding(idx, emb), [emb]),
        ("IndexBackward0", lambda: a[idx], [a]),
        ("SelectBackward0", lambda: b1[:, 1], [b1]),
        ("SliceBackward0", lambda: a[:, 1:4:2], [a]),
        ("StackBackward0", lambda: torch.stack([a, b], 1), [a, b]),
        ("WhereBackward0", lambda: torch.where(a > 0, a, b), [a, b]),
    ]


CASES = _cases()


@pytest.mark.parametrize("node_name,make,inputs", CASES, ids=[c[0] for c in CASES])
def test_formula_matches_autograd(node_name, make, inputs):
    out = make()
    assert out.grad_fn.name() == node_name
    grad = torch.randn_like(out)
    expected = torch.autograd.grad(out, inputs, grad, retain_graph=True)
    got = evaluate(out.grad_fn, grad)
    assert len(got) == len(inputs)
    for name, inp, g, e in zip(FORMULAS[node_name].rules * len(inputs), inputs, got, expected):
        assert g is not None, f"{node_name}: no check for {name.input}"
        g = g.to(e.dtype).sum_to_size(inp.shape)  # the engine sums broadcast grads to the input's shape
        torch.testing.assert_close(g, e, msg=lambda m: f"{node_name} grad_{name.input}: {m}")


def test_at_least_forty_formulas_are_checked():
    checked = {c[0] for c in CASES}
    assert len(checked) >= 40
    assert all(FORMULAS[n].rules[0].check for n in checked)


def test_formula_lines_use_the_scripts_names():
    lines = formula_lines("MulBackward0", {"self": "a", "other": "b"}, ["a", "b"], "c")
    assert lines == ["grad_self (a) = grad_c · b", "grad_other (b) = grad_c · a"]
    assert formula_lines("MulBackward0") == ["grad_self = grad · other", "grad_other = grad · self"]
    assert formula_lines("SigmoidBackward0", {}, ["h"], "s") == ["grad_self (h) = grad_s · s · (1 − s)"]
    assert formula_lines("StackBackward0", {}, ["a", "b"]) == [
        "grad_tensors[0] (a) = grad.select(dim, 0)", "grad_tensors[1] (b) = grad.select(dim, 1)"]
    assert formula_lines("NoSuchBackward") == []
