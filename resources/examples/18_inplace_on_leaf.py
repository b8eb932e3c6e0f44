# In-place on a leaf that requires grad is an error
# x += 1 would overwrite x's value, which autograd needs to track x as the input of the graph, so
# torch raises "a leaf Variable that requires grad is being used in an in-place operation".
# Fix: do it under torch.no_grad() (how optimizers update weights), or make a new tensor: x = x + 1.
# The script is meant to stop with this error.
import torch

x = torch.tensor([1.0, 2.0], requires_grad=True)
with torch.no_grad():
    x += 1  # fine: not recorded
print("x after the no_grad update:", x)

y = (x * x).sum()
y.backward()
print("x.grad =", x.grad)  # 2x = [4, 6]

x += 1  # RuntimeError: a leaf Variable that requires grad is being used in an in-place operation
