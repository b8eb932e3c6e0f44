# .contiguous() copies a non-contiguous tensor
# x.t() is a view with stride (1, 4). Calling .contiguous() on it allocates a new storage with the
# elements laid out row by row (stride (3, 1)). Changing x afterwards changes the view but not the copy.
# On an already contiguous tensor, .contiguous() returns the tensor itself.
import torch

x = torch.arange(12.0).view(3, 4)
transposed = x.t()
transposed_copy = transposed.contiguous()

print("transposed stride:", transposed.stride(), " contiguous:", transposed.is_contiguous())
print("copy stride:      ", transposed_copy.stride(), " contiguous:", transposed_copy.is_contiguous())
print("same storage as x?  transposed:",
      transposed.untyped_storage().data_ptr() == x.untyped_storage().data_ptr(),
      " copy:", transposed_copy.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())

x[0, 1] = -1.0
print("after x[0, 1] = -1:")
print("transposed[1, 0] =", transposed[1, 0].item())  # -1: a view sees the change
print("transposed_copy[1, 0] =", transposed_copy[1, 0].item())  # 1: the copy does not

print("x.contiguous() is x:", x.contiguous() is x)
