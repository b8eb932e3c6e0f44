# The first NaN: where a loss stops being a number, and why
# A hand-written binary cross-entropy, -[y log p + (1 - y) log(1 - p)] with p = sigmoid(z). For the
# confident sample (z = 20) sigmoid rounds to exactly 1.0 in float32, so 1 - p is 0: log(0) is -inf,
# and (1 - y) * -inf with y = 1 is 0 * -inf = nan. One nan in the mean makes the whole loss nan, and
# backward spreads it to every weight: LogBackward0 computes 0 / 0 = nan.
# `main.py trace 33_first_nan.py --nan-check` names both: the first non-finite value is the log at
# line 25 (its input q in [0, 0.924]), the first non-finite gradient is LogBackward0 of that line.
# The fix: F.binary_cross_entropy_with_logits works from z itself (log-sum-exp) and stays finite.
import torch
import torch.nn as nn
import torch.nn.functional as F


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 1)

    def forward(self, x):
        return self.fc(x).squeeze(1)  # the logit z


def bce(p, y):
    q = 1 - p  # exactly 0 where p rounded to 1.0
    log_q = torch.log(q)  # log(0) = -inf: the first non-finite value
    return -(y * torch.log(p) + (1 - y) * log_q).mean()  # 0 * -inf = nan


model = Classifier()
with torch.no_grad():
    model.fc.weight.copy_(torch.tensor([[4.0, 3.0]]))
    model.fc.bias.zero_()
x = torch.tensor([[0.5, -0.5], [5.0, 0.0], [-1.0, 0.5]])  # logits 0.5, 20 and -2.5
y = torch.tensor([1.0, 1.0, 0.0])

p = torch.sigmoid(model(x))
loss = bce(p, y)
loss.backward()
print("hand-written loss =", loss.item())  # nan
print("fc.weight.grad =", model.fc.weight.grad)  # nan everywhere

model.zero_grad()
safe = F.binary_cross_entropy_with_logits(model(x), y)
safe.backward()
print("with logits: loss =", round(safe.item(), 4))  # finite
print("fc.weight.grad =", model.fc.weight.grad)  # finite
