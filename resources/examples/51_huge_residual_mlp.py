# A huge graph: residual MLP with 8,333 blocks, 50,000 autograd nodes
# Each block computes h = h + relu(fc(h)) with fc = Linear(16, 16): six nodes per block
# (AddmmBackward0, TBackward0, ReluBackward0, AddBackward0 and two AccumulateGrad for fc.weight and
# fc.bias), plus PowBackward0 and MeanBackward0 for the loss: 6 * 8,333 + 2 = 50,000 nodes, one backward.
# Modules are named blocks.0.fc ... blocks.8332.fc. A stress test for capture, layout and rendering.
# The small weight init keeps 8,333 residual additions from overflowing.
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, width, init_std):
        super().__init__()
        self.fc = nn.Linear(width, width)
        nn.init.normal_(self.fc.weight, std=init_std)
        nn.init.zeros_(self.fc.bias)

    def forward(self, hidden):
        return hidden + torch.relu(self.fc(hidden))


class ResidualMLP(nn.Module):
    def __init__(self, width, num_blocks):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, 0.1 / num_blocks) for _ in range(num_blocks))

    def forward(self, hidden):
        for block in self.blocks:
            hidden = block(hidden)
        return hidden


torch.manual_seed(0)
model = ResidualMLP(width=16, num_blocks=8333)
inputs = torch.randn(8, 16)

start = time.perf_counter()
output = model(inputs)
loss = output.pow(2).mean()
loss.backward()
print(f"loss = {loss.item():.4f}, forward + backward in {time.perf_counter() - start:.3f} s")
print("blocks.0.fc.weight.grad norm =", model.blocks[0].fc.weight.grad.norm().item())
