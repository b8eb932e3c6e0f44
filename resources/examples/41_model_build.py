# A model file with a build() function
# Instead of top-level `model` and `example_input`, this file defines build() returning both;
# the app calls it, then runs the forward pass, a loss and backward itself.
# The graph shows AddmmBackward0 for each Linear, NativeLayerNormBackward0 for the LayerNorm and
# TanhBackward0, with parameters named encoder.0.weight, encoder.1.weight, head.weight and so on.
import torch
from torch import nn


class TinyEncoder(nn.Module):
    def __init__(self, in_features=8, hidden=16, out_features=4):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(in_features, hidden), nn.LayerNorm(hidden), nn.Tanh())
        self.head = nn.Linear(hidden, out_features)

    def forward(self, inputs):
        return self.head(self.encoder(inputs))


def build():
    torch.manual_seed(0)
    model = TinyEncoder()
    example_input = torch.randn(5, 8)
    return model, example_input


if __name__ == "__main__":
    model, example_input = build()
    print(model)
    with torch.no_grad():
        print("output shape:", tuple(model(example_input).shape))
