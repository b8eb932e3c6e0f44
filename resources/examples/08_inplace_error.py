# An in-place change to a saved tensor breaks backward
# sigmoid saves its output b to compute its gradient b * (1 - b). b.mul_(2) then changes b in place,
# bumping its version counter from 0 to 1. Backward detects the stale saved tensor and raises
# "one of the variables needed for gradient computation has been modified by an inplace operation".
# Look at SigmoidBackward0 and its saved result; the script is meant to stop with this error.
import torch

torch.manual_seed(0)
a = torch.randn(3, requires_grad=True)
b = a.sigmoid()
print("b._version before mul_ =", b._version)
b.mul_(2)
print("b._version after mul_  =", b._version)
b.sum().backward()
