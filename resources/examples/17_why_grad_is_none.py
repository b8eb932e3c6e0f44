# Four reasons .grad is None after backward
# unused:      w requires grad but loss does not depend on it, so backward never reaches it.
# detached:    d = x.detach() shares x's memory but has no graph: no gradient can reach it.
# not a leaf:  h = x * 2 is an intermediate; autograd keeps .grad only for leaves unless h.retain_grad().
# no grad:     c = torch.ones(2) has requires_grad=False, so autograd computes nothing for it.
# Select each tensor in the Tensors list: the inspector names its reason.
import torch

x = torch.tensor([1.0, 2.0], requires_grad=True)
w = torch.tensor([5.0, 6.0], requires_grad=True)  # never used
d = x.detach()
h = x * 2
c = torch.ones(2)

loss = (h * c + d).sum()
loss.backward()
for name, t in (("x", x), ("w", w), ("d", d), ("h", h), ("c", c)):
    print(f"{name}.grad =", t.grad)
