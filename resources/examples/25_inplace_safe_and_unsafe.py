# An in-place operation that is safe, and one that breaks backward
# Safe: y = x * 2 saves only the constant 2, not y, so y.add_(1) changes nothing that backward needs
# (look at AddBackward0 stacked on MulBackward0; x.grad = 2).
# Unsafe: z = x.exp() saves its output z for the backward (d exp/dx = exp(x)); z.add_(1) modifies it,
# and backward raises "modified by an inplace operation". The script is meant to stop with this error.
import torch

x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)

y = x * 2
y.add_(1)
y.sum().backward()
print("safe in-place: y =", y.detach(), " x.grad =", x.grad)  # [2, 2, 2]

z = x.exp()
z.add_(1)
z.sum().backward()
