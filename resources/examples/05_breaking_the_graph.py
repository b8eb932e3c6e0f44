# Three ways to break the graph: detach(), torch.no_grad() and .item()
# Tensors computed this way have no grad_fn, so backward cannot reach x through them.
# Only `connected` stays attached to x; the captured graph contains just its nodes.
# x.grad = 3 * x**2 = 12: the detached, no_grad and item() paths contribute nothing.
import torch

x = torch.tensor(2.0, requires_grad=True)

detached = x.detach() * 10
with torch.no_grad():
    under_no_grad = x * 10
as_number = x.item() * 10  # a plain Python float

print("detached.grad_fn =", detached.grad_fn, " requires_grad =", detached.requires_grad)
print("under_no_grad.grad_fn =", under_no_grad.grad_fn, " requires_grad =", under_no_grad.requires_grad)
print("as_number =", as_number, type(as_number))

connected = x**3 + detached + under_no_grad + as_number
print("connected.grad_fn =", connected.grad_fn)

connected.backward()
print("x.grad =", x.grad)  # 12
