# Device mismatch: every tensor of an op must be on the same device
# Tensors on the "meta" device have shapes and dtypes but no data, so this runs on any machine;
# the same error appears with "cuda:0" and "cpu". Moving a tensor with .to(device) is an op
# (ToCopyBackward0) that gradients flow back through.
# The script is meant to stop with the error on the last line.
import torch

w = torch.randn(3, requires_grad=True)
on_meta = w.to("meta")  # ToCopyBackward0: the gradient flows back to w on the CPU
print("on_meta:", on_meta.device, on_meta.grad_fn)
also_meta = torch.ones(3, device="meta")
fine = on_meta * also_meta  # both on meta: allowed
print("fine:", fine.device, fine.grad_fn)

cpu_tensor = torch.ones(3)
broken = on_meta * cpu_tensor  # RuntimeError: tensors on different devices
