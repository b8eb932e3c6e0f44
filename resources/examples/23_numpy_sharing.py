# Sharing memory with NumPy
# torch.from_numpy(array) wraps the array's memory: changing the array changes the tensor.
# torch.tensor(array) copies. tensor.numpy() goes the other way and also shares memory.
# Compare the printed values after each modification.
import numpy as np
import torch

array = np.array([1.0, 2.0, 3.0], dtype=np.float32)
shared = torch.from_numpy(array)
copied = torch.tensor(array)

array[0] = 100.0
print("after array[0] = 100:")
print("  array  =", array)
print("  shared =", shared)  # 100: same memory
print("  copied =", copied)  # 1: a copy

back_to_numpy = shared.numpy()
shared[1] = -5.0
print("after shared[1] = -5:")
print("  back_to_numpy =", back_to_numpy)  # -5: .numpy() shares too
print("  array         =", array)

print("array memory is shared's memory:", shared.data_ptr() == array.ctypes.data)
