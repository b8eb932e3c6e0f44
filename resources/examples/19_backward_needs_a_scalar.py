# backward() without an argument needs a scalar output
# y = x.mean(dim=1) has one value per row. y.backward() raises "grad can be implicitly created only
# for scalar outputs": backward needs the gradient of something with respect to y, one number per element.
# Give it explicitly (y.backward(torch.ones_like(y)) means "the sum of y"), or reduce first (y.sum()).
# The first call below works; the script is meant to stop with the error on the second.
import torch

x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
y = x.mean(dim=1)
y.backward(torch.ones_like(y))
print("x.grad =", x.grad)  # 1/3 everywhere

x.grad = None
z = x.mean(dim=1)
z.backward()  # RuntimeError: grad can be implicitly created only for scalar outputs
