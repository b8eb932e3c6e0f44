# Basic indexing returns views, clone() and advanced indexing copy
# Slices and integer indices (x[0], x[:, 1], x[::2]) share x's storage: writing to them changes x.
# clone() allocates new storage. Indexing with a tensor or list of indices (advanced indexing) and
# boolean masks also copy, so writing to the result leaves x unchanged.
import torch

x = torch.arange(12.0).view(3, 4)


def describe(name, tensor):
    shares = tensor.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    print(f"{name:<10} shares storage with x: {shares!s:<5}  is a view: {tensor._base is not None}")


first_row = x[0]
second_column = x[:, 1]
every_other_row = x[::2]
cloned = x.clone()
picked_rows = x[[0, 2]]
masked = x[x > 5]

describe("x[0]", first_row)
describe("x[:, 1]", second_column)
describe("x[::2]", every_other_row)
describe("x.clone()", cloned)
describe("x[[0, 2]]", picked_rows)
describe("x[x > 5]", masked)

first_row[0] = 100.0
cloned[0, 1] = 200.0
picked_rows[0, 2] = 300.0
print("after writing to first_row, cloned and picked_rows:")
print(x)  # only x[0, 0] changed
