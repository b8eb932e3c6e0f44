# Vanishing gradients: a deep MLP of sigmoids
# Ten Linear(32, 32) layers, each followed by a sigmoid, then a Linear(32, 1) head, trained for five
# SGD steps. The sigmoid's derivative is at most 0.25, and backward multiplies one such factor (and a
# small weight matrix) per layer: the gradient shrinks about sevenfold at every layer it goes down.
# The head's gradient norm is ~1.5; layers.0, the first layer, gets ~1e-8 - a hundred million times
# less - so its weights barely move (‖Δparam‖ / ‖param‖ ~4e-11 per step). The gradient norms of each
# call flag layers.0 to layers.6 as vanishing: under a thousandth of the call's largest module norm.
# Fixes: ReLU-family activations, careful initialisation (Xavier / Kaiming), normalisation layers,
# residual connections.
import torch
from torch import nn


class DeepSigmoidMLP(nn.Module):
    def __init__(self, width=32, depth=10):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for layer in self.layers:
            x = torch.sigmoid(layer(x))
        return self.head(x)


torch.manual_seed(0)
model = DeepSigmoidMLP()
inputs = torch.randn(64, 32)
targets = inputs[:, :1].sin()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

for step in range(5):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    optimizer.step()
    first = model.layers[0].weight.grad.norm().item()
    last = model.head.weight.grad.norm().item()
    print(f"step {step}  loss {loss.item():.4f}  ‖grad‖ layers.0.weight {first:.2e}  head.weight {last:.2e}")
