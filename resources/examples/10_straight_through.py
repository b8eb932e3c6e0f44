# A straight-through estimator as a custom autograd.Function
# round() has zero gradient almost everywhere. RoundSTE rounds in forward but passes the
# gradient through unchanged in backward, so x.grad is all ones.
# Look at the RoundSTEBackward node: a custom Function shows up under its class name.
import torch


class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


x = torch.tensor([0.2, 1.7, -0.6, 2.5], requires_grad=True)
rounded = RoundSTE.apply(x)
print("rounded =", rounded)

rounded.sum().backward()
print("x.grad =", x.grad)  # [1, 1, 1, 1]

plain = torch.round(x)
(plain_grad,) = torch.autograd.grad(plain.sum(), x)
print("grad through plain round() =", plain_grad)  # zeros
