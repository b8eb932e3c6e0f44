# detach() shares storage and the version counter
# x.detach() returns a tensor without grad_fn and with requires_grad=False, but on the same storage.
# Writing to the detached tensor in place changes x too and bumps the version counter they share,
# so autograd can still tell that a saved tensor was modified.
import torch

x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
detached = x.detach()

print("same storage:", detached.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())
print("detached.requires_grad =", detached.requires_grad, " detached.grad_fn =", detached.grad_fn)
print("versions before:", x._version, detached._version)

detached.zero_()
print("after detached.zero_(): x =", x)
print("versions after: ", x._version, detached._version)  # both 1
