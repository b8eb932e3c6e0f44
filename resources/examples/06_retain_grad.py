# Keeping the gradient of a non-leaf with retain_grad()
# Only leaves get .grad by default. hidden calls retain_grad(), other_hidden does not.
# After backward, hidden.grad is filled in and other_hidden.grad is None (reading it warns).
# Both non-leaves are ordinary MulBackward0/AddBackward0 outputs in the graph.
import torch

x = torch.tensor(2.0, requires_grad=True)
hidden = x * 3
hidden.retain_grad()
other_hidden = x + 1
out = hidden * other_hidden  # 3x * (x + 1)

out.backward()
print("x.grad =", x.grad)  # d(3x^2 + 3x)/dx = 6x + 3 = 15
print("hidden.grad =", hidden.grad)  # other_hidden = 3
print("hidden.is_leaf =", hidden.is_leaf, " other_hidden.is_leaf =", other_hidden.is_leaf)
print("other_hidden.grad =", other_hidden.grad)  # None
