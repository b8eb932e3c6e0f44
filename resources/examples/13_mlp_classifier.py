# A small MLP classifier trained with cross-entropy
# Three Gaussian blobs in 4 dimensions, classified by Linear(4, 16) -> ReLU -> Linear(16, 3).
# Each step's graph: two AddmmBackward0 (one per Linear, with TBackward0 for the transposed weights),
# ReluBackward0, and the log-softmax + NLL nodes of cross_entropy. Parameters are named after the
# modules (fc1.weight, fc1.bias, fc2.weight, fc2.bias). Watch the loss drop and the accuracy rise.
import torch
from torch import nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, inputs):
        hidden = F.relu(self.fc1(inputs))
        return self.fc2(hidden)


torch.manual_seed(0)
centers = torch.tensor([[2.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0]])
labels = torch.arange(3).repeat_interleave(20)
features = centers[labels] + 0.5 * torch.randn(60, 4)

model = MLP()
optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

for epoch in range(10):
    logits = model(features)
    loss = F.cross_entropy(logits, labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    accuracy = (logits.argmax(dim=1) == labels).float().mean()
    print(f"epoch {epoch}  loss {loss.item():.4f}  accuracy {accuracy.item():.2f}")
