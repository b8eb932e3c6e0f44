# The CUDA caching allocator: allocated vs reserved, and torch.cuda.empty_cache()
# On CUDA, PyTorch keeps the blocks of freed tensors in a cache for reuse. "allocated" counts the
# bytes of live tensors; "reserved" the bytes the allocator holds from the driver, cache included.
# After `del`, allocated drops but reserved stays; empty_cache() hands the cache back to the driver,
# so reserved falls to allocated. The Memory tab shades the cache between the two lines.
# On a CPU there is no caching allocator: the script says so, and the chart shows process RSS and
# saved tensors, with its zero_grad / optimizer.step / empty_cache markers all the same.
import os

import torch
from torch import nn

device = os.environ.get("BACKPROP_STUDIO_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
on_cuda = device.startswith("cuda")


def report(when):
    if on_cuda:
        mb = 2**20
        print(f"{when:<32} allocated {torch.cuda.memory_allocated() / mb:7.1f} MB"
              f"   reserved {torch.cuda.memory_reserved() / mb:7.1f} MB")
    else:
        print(f"{when:<32} (CPU run: allocated and reserved exist on CUDA only)")


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
report("model built")
for step in range(3):
    batch = torch.randn(2048, 512, device=device)  # 4 MB in; forward saves 8 MB of activations
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    report(f"after step {step}")
del batch, loss
report("after del batch, loss")
torch.cuda.empty_cache()
report("after torch.cuda.empty_cache()")
