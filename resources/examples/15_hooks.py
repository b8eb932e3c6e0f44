# Hooks: code that runs on a gradient during backward
# x.register_hook(fn) runs fn on the gradient reaching x; what fn returns replaces that gradient.
# Here double_grad doubles it: the edges into x carry 3 + 3 = 6, and x.grad ends up 12.
# A hook on a non-leaf (y) sees the gradient of y before y's node runs; returning None changes nothing.
# Module.register_full_backward_hook adds BackwardHookFunctionBackward nodes around the module.
import torch

x = torch.tensor(3.0, requires_grad=True)


def double_grad(grad):
    return grad * 2


x.register_hook(double_grad)
y = x * x
y.register_hook(lambda grad: print("gradient reaching y:", grad))

layer = torch.nn.Linear(2, 1)
layer.register_full_backward_hook(lambda module, grad_input, grad_output: print("layer grad_output:", grad_output))
inp = torch.ones(1, 2, requires_grad=True)
out = layer(inp).sum() + y
out.backward()
print("x.grad =", x.grad)  # 2 * (dy/dx = 2x = 6) = 12
