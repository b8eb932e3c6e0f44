# A polynomial: y = x**2 + 2*x + 1
# Each operation adds one node: PowBackward0 for x**2, MulBackward0 for 2*x, two AddBackward0.
# x is used twice, so its AccumulateGrad node receives two gradients that are summed:
# dy/dx = 2*x + 2 = 8 at x = 3.
# The constants 2 and 1 do not require grad, so they have no node in the graph.
import torch

x = torch.tensor(3.0, requires_grad=True)
y = x**2 + 2 * x + 1
print("y =", y)  # 16

y.backward()
print("x.grad =", x.grad)  # 2*3 + 2 = 8
