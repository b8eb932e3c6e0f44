# Backward twice without retain_graph
# The first backward works and frees the saved tensors of the graph (here MulBackward0 saves x and w).
# The second backward on the same graph raises "Trying to backward through the graph a second time".
# Pass retain_graph=True to the first call to keep them. The script is meant to stop with this error.
import torch

x = torch.tensor(2.0, requires_grad=True)
w = torch.tensor(5.0, requires_grad=True)
loss = x * w

loss.backward()
print("x.grad =", x.grad)  # 5
print("w.grad =", w.grad)  # 2

loss.backward()
