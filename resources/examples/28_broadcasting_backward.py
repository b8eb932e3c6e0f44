# Broadcasting in backward: a gradient is summed back to the input's shape
# b has shape [3] and is added to every row of x @ w ([4, 3]): forward broadcasts it 4 times.
# In backward its gradient arrives with shape [4, 3] and is summed over the rows: [4, 3] → Σ → [3].
# The same holds for the scalar s multiplied into every element: [4, 3] → Σ → [].
import torch

x = torch.ones(4, 2)
w = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
b = torch.tensor([0.1, 0.2, 0.3], requires_grad=True)
s = torch.tensor(2.0, requires_grad=True)
out = (x @ w + b) * s
loss = out.sum()
loss.backward()
print("b.grad =", b.grad)  # 4 rows * s = [8, 8, 8]
print("s.grad =", s.grad)  # sum of x @ w + b = 4 * (5 + 7 + 9 + 0.6) = 86.4
print("w.grad =", w.grad)  # x.T @ (s * ones) = 8 everywhere
