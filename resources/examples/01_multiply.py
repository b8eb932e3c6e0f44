# Multiplying two leaves
# The smallest possible graph: c = a * b, then c.backward().
# Look at MulBackward0 at the root: its two inputs are AccumulateGrad nodes, one per leaf.
# MulBackward0 saves both operands (a and b), because d(a*b)/da = b and d(a*b)/db = a.
# After backward, a.grad = 3 (the value of b) and b.grad = 2 (the value of a).
import torch

a = torch.tensor(2.0, requires_grad=True)
b = torch.tensor(3.0, requires_grad=True)
c = a * b
print("c =", c)
print("c.grad_fn =", c.grad_fn)
print("next_functions =", c.grad_fn.next_functions)

c.backward()
print("a.grad =", a.grad)  # 3.0
print("b.grad =", b.grad)  # 2.0
