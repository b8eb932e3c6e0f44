# Views, strides and storage offsets
# x = torch.arange(12.).view(3, 4) owns one storage of 12 floats. x.t(), x[1], x.view(-1) and
# x.permute(1, 0) are views: the same storage seen with another shape, stride or offset.
# x.t() has stride (1, 4) and is not contiguous, so .view() on it fails; reshape() copies instead,
# and .contiguous() makes a compact copy. Compare the storage pointers printed for each tensor.
import torch


def describe(name, tensor):
    print(
        f"{name:<22} shape={tuple(tensor.shape)!s:<8} stride={tensor.stride()!s:<8} "
        f"offset={tensor.storage_offset():<2} contiguous={tensor.is_contiguous()!s:<5} "
        f"storage={tensor.untyped_storage().data_ptr():#x}"
    )


x = torch.arange(12.0).view(3, 4)
print(x)
describe("x", x)

transposed = x.t()
describe("x.t()", transposed)  # stride (1, 4)

row = x[1]
describe("x[1]", row)  # storage offset 4

flat = x.view(-1)
describe("x.view(-1)", flat)

permuted = x.permute(1, 0)
describe("x.permute(1, 0)", permuted)

try:
    permuted.view(-1)
except RuntimeError as error:
    print("permuted.view(-1) failed:", error)

reshaped = permuted.reshape(-1)
describe("permuted.reshape(-1)", reshaped)  # new storage: reshape had to copy

compact = permuted.contiguous()
describe("permuted.contiguous()", compact)  # new storage, stride (3, 1)

print("x.contiguous() is x:", x.contiguous() is x)  # already contiguous: no copy

row[0] = 100.0  # writes through the view into x's storage
print("after row[0] = 100: x[1, 0] =", x[1, 0].item(), " reshaped[1] =", reshaped[1].item())
