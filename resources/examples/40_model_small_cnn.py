# A model file: a tiny convolutional network
# This file only defines `model` (an nn.Module) and `example_input`; open it as a model and the app
# runs the forward pass, a loss and backward itself. Look for ConvolutionBackward0, ReluBackward0,
# MaxPool2DWithIndicesBackward0, ViewBackward0 (the flatten) and AddmmBackward0 (the classifier),
# with parameters named conv1.weight, conv2.weight, classifier.weight and so on.
import torch
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(4, 8, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.classifier = nn.Linear(8 * 2 * 2, 10)

    def forward(self, images):
        features = self.pool(torch.relu(self.conv1(images)))  # 4 x 4 x 4
        features = self.pool(torch.relu(self.conv2(features)))  # 8 x 2 x 2
        return self.classifier(features.flatten(1))


torch.manual_seed(0)
model = SmallCNN()
example_input = torch.randn(2, 1, 8, 8)

if __name__ == "__main__":
    print(model)
    print("parameters:", sum(parameter.numel() for parameter in model.parameters()))
    with torch.no_grad():
        print("output shape:", tuple(model(example_input).shape))
