# A memory leak: keeping loss tensors keeps their graphs alive
# Each epoch trains on (inputs, targets) and then measures a validation loss, appending the tensor
# itself with losses.append(loss). A tensor with a grad_fn holds its whole graph: every ReluBackward0
# and AddmmBackward0 with its saved activations (256x256 floats each) stays in memory, epoch after epoch.
# Backward frees the saved tensors of the graphs it runs, but these validation graphs never see a
# backward, so after 20 epochs the list holds 20 graphs and about 10 MB of saved activations.
# Compare with 31_graph_leak_fixed.py.
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
    losses.append(loss)  # keeps loss.grad_fn and everything it saved

print(f"validation loss: first {losses[0].item():.4f}, last {losses[-1].item():.4f}")
print("graphs kept alive:", sum(value.grad_fn is not None for value in losses))
