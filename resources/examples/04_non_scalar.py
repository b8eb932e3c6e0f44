# Backward from a non-scalar output
# y = x * 2 is a vector, so y.backward() alone fails with "grad can be implicitly created only for
# scalar outputs": autograd computes vector-Jacobian products and needs the vector.
# Passing gradient=torch.ones_like(y) gives the same result as y.sum().backward().
# Look at the root MulBackward0: it receives a gradient of shape [3] instead of a scalar.
import torch

x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
y = x * 2
print("y =", y)

y.backward(torch.ones_like(y))
print("x.grad =", x.grad)  # [2, 2, 2]
