# dtype promotion along a graph
# float32 * float64 gives float64 (type promotion). In backward each gradient is cast back to its
# input's dtype: w (float32) gets a float32 .grad although the loss is float64. The edges where the
# gradient changes dtype are marked "float64 → float32".
# An integer tensor never requires grad: only floating point (and complex) tensors can.
import torch

w = torch.tensor([1.0, 2.0], requires_grad=True)  # float32
scale = torch.tensor([0.5, 0.25], dtype=torch.float64, requires_grad=True)
counts = torch.tensor([3, 4])  # int64, a constant
loss = (w * scale * counts).sum()
print("loss.dtype =", loss.dtype)  # float64
loss.backward()
print("w.grad =", w.grad, w.grad.dtype)  # scale * counts = [1.5, 1.0], float32
print("scale.grad =", scale.grad, scale.grad.dtype)  # w * counts = [3, 8], float64
