# Second derivatives with create_graph=True
# torch.autograd.grad(y, x, create_graph=True) returns dy/dx = 3*x**2 as a tensor that has its own graph.
# Compare the two captured calls: the second graph is the backward of the first (note the extra nodes
# that compute 3*x**2), and differentiating it again gives d2y/dx2 = 6*x.
# At x = 2 both derivatives happen to equal 12.
import torch

x = torch.tensor(2.0, requires_grad=True)
y = x**3

(dy_dx,) = torch.autograd.grad(y, x, create_graph=True)
print("dy/dx =", dy_dx)  # 3 * 2**2 = 12
print("dy/dx.grad_fn =", dy_dx.grad_fn)

(d2y_dx2,) = torch.autograd.grad(dy_dx, x)
print("d2y/dx2 =", d2y_dx2)  # 6 * 2 = 12
