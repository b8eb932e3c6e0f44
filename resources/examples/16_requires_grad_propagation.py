# requires_grad propagates: a result requires grad if any input does
# a requires grad, b does not. a * b requires grad and has a grad_fn; b * 2 does not.
# Only leaves created with requires_grad=True (or set with .requires_grad_()) get a .grad.
# c = b * 2 is a constant for autograd: its input to the sum is a cut (drawn as a stub).
import torch

a = torch.tensor([1.0, 2.0], requires_grad=True)
b = torch.tensor([3.0, 4.0])  # requires_grad=False by default
product = a * b
c = b * 2
print("product.requires_grad =", product.requires_grad, " grad_fn =", product.grad_fn)
print("c.requires_grad =", c.requires_grad, " grad_fn =", c.grad_fn)

b.requires_grad_()  # from now on b is tracked too
later = (a * b).sum() + c.sum()
later.backward()
print("a.grad =", a.grad)  # b = [3, 4]
print("b.grad =", b.grad)  # a = [1, 2]: product was made before b required grad, later after
