# Linear regression from scratch
# Data follows y = 2x + 1 plus noise; w and b are leaves updated by hand.
# Each epoch builds a new graph (MulBackward0, AddBackward0, SubBackward0, PowBackward0, MeanBackward0)
# and runs one backward. Updates happen under torch.no_grad() so they are not recorded,
# and .grad.zero_() stops gradients from accumulating. At the end w is close to 2 and b close to 1.
import torch

torch.manual_seed(0)
x = torch.linspace(-1, 1, 100).unsqueeze(1)
y = 2 * x + 1 + 0.1 * torch.randn(x.shape)

w = torch.zeros(1, requires_grad=True)
b = torch.zeros(1, requires_grad=True)
learning_rate = 0.1

for epoch in range(200):
    prediction = x * w + b
    loss = ((prediction - y) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        w -= learning_rate * w.grad
        b -= learning_rate * b.grad
    w.grad.zero_()
    b.grad.zero_()
    if epoch % 50 == 0:
        print(f"epoch {epoch:3d}  loss {loss.item():.4f}")

print(f"final loss {loss.item():.4f}")
print(f"w = {w.item():.3f}  (true 2)")
print(f"b = {b.item():.3f}  (true 1)")
