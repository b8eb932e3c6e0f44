# Gradient checkpointing: trade compute for memory
# torch.utils.checkpoint keeps no activations of the checkpointed function; backward runs it again.
# use_reentrant=True: the graph shows one CheckpointFunctionBackward node, which reruns `block` and calls
#   backward on that recomputed graph from inside the running backward (a nested call: #1 inside #0).
#   layer1's grads come from that nested call.
# use_reentrant=False: an ordinary-looking graph, but its saved tensors are dropped after forward and
#   recomputed when backward needs them (marked "saved tensors recomputed").
# Both give exactly the grads of the plain model.
import torch
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)
layer1 = torch.nn.Linear(4, 4)
layer2 = torch.nn.Linear(4, 1)
x = torch.randn(2, 4, requires_grad=True)


def block(t):
    return torch.relu(layer1(t))


hidden = checkpoint(block, x, use_reentrant=True)
loss = layer2(hidden).sum()
loss.backward()  # calls #0 and, nested inside it, #1
print("layer1.weight.grad (reentrant):", layer1.weight.grad)

layer1.zero_grad()
hidden2 = checkpoint(block, x, use_reentrant=False)
loss2 = layer2(hidden2).sum()
loss2.backward()  # call #2
print("layer1.weight.grad (non-reentrant):", layer1.weight.grad)

# What checkpointing saves: a deeper model whose blocks widen 4x inside, run checkpointed, then plain.
# Reentrant checkpointing keeps only each block's input (which must require grad) and recomputes the
# block in a nested backward; the plain run keeps every activation. The Memory tab sets the two side
# by side: "with checkpointing: peak saved ...; without: ...".
torch.manual_seed(0)
blocks = torch.nn.ModuleList(
    torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 128)) for _ in range(3))
head = torch.nn.Linear(128, 1)
batch = torch.randn(256, 128, requires_grad=True)


def deep(t, checkpointed):
    for b in blocks:
        t = checkpoint(b, t, use_reentrant=True) if checkpointed else b(t)
    return head(t).sum()


deep_loss = deep(batch, checkpointed=True)
deep_loss.backward()  # call #3, with #4 to #6 nested: one per block
plain_loss = deep(batch, checkpointed=False)
plain_loss.backward()  # call #7: the same model without checkpointing
print("head.bias.grad (both runs):", head.bias.grad)
