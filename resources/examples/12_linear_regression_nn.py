# Linear regression with nn.Linear, nn.MSELoss and torch.optim.SGD
# The same problem as 11, written the usual way. model.weight and model.bias are the leaves;
# nn.Linear builds an AddmmBackward0 node (bias + x @ weight.t()) and MSELoss an MseLossBackward0.
# optimizer.zero_grad() / loss.backward() / optimizer.step() replace the manual updates.
# At the end the weight is close to 2 and the bias close to 1.
import torch
from torch import nn

torch.manual_seed(0)
x = torch.linspace(-1, 1, 100).unsqueeze(1)
y = 2 * x + 1 + 0.1 * torch.randn(x.shape)

model = nn.Linear(1, 1)
loss_fn = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

for epoch in range(200):
    prediction = model(x)
    loss = loss_fn(prediction, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if epoch % 50 == 0:
        print(f"epoch {epoch:3d}  loss {loss.item():.4f}")

print(f"final loss {loss.item():.4f}")
print(f"weight = {model.weight.item():.3f}  (true 2)")
print(f"bias   = {model.bias.item():.3f}  (true 1)")
