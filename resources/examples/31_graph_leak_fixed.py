# The leak fixed: store numbers, not tensors
# Same training as 30_graph_leak.py, but losses.append(loss.item()) stores a Python float.
# Nothing refers to the validation graph any more once `loss` is reassigned, so at most one graph
# (the current epoch's) is alive at a time and its saved activations are freed.
# Evaluating under torch.no_grad() would avoid building the validation graph at all.
import torch
from torch import nn

torch.manual_seed(0)
inputs = torch.randn(256, 64)
targets = torch.randn(256, 1)
val_inputs = torch.randn(256, 64)
val_targets = torch.randn(256, 1)

model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
loss_fn = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

losses = []
for epoch in range(20):
    train_loss = loss_fn(model(inputs), targets)
    optimizer.zero_grad()
    train_loss.backward()
    optimizer.step()

    loss = loss_fn(model(val_inputs), val_targets)
    losses.append(loss.item())  # a float: the graph can be freed

print(f"validation loss: first {losses[0]:.4f}, last {losses[-1]:.4f}")
print("graphs kept alive by the list:", sum(isinstance(value, torch.Tensor) for value in losses))
