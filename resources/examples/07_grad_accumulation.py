# Gradients accumulate across backward calls
# Two backward calls without zeroing: x.grad is added to, not replaced (4, then 8).
# Each call builds a fresh graph y = x**2; x.grad.zero_() resets the sum before a third call.
# This is why training loops call optimizer.zero_grad() every step.
import torch

x = torch.tensor(2.0, requires_grad=True)

y = x**2
y.backward()
print("after 1st backward: x.grad =", x.grad)  # 4

y = x**2
y.backward()
print("after 2nd backward: x.grad =", x.grad)  # 8 (accumulated)

x.grad.zero_()
print("after zero_():      x.grad =", x.grad)  # 0

y = x**2
y.backward()
print("after 3rd backward: x.grad =", x.grad)  # 4 again
