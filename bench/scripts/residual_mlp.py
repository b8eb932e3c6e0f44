# A residual MLP with 800 blocks (Linear(256, 256) + ReLU + skip), batch 512: 4,802 autograd nodes,
# the graph of resources/examples/50_big_residual_mlp.py with real-sized tensors.
import os

import torch
from torch import nn

torch.manual_seed(0)
device = os.environ.get("BACKPROP_STUDIO_DEVICE", "cpu")
blocks = int(os.environ.get("RESIDUAL_BLOCKS", "800"))


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)
        nn.init.normal_(self.fc.weight, std=0.1 / blocks)
        nn.init.zeros_(self.fc.bias)

    def forward(self, hidden):
        return hidden + torch.relu(self.fc(hidden))


model = nn.Sequential(*(Block(256) for _ in range(blocks))).to(device)
x = torch.randn(512, 256, device=device)
out = model(x)
loss = out.pow(2).mean()
loss.backward()
print(f"loss {loss.item():.4f}")
