# Mixed precision: GradScaler skips a step whose gradients overflowed
# Under torch.autocast(dtype=torch.float16) the linear layers compute in float16, whose largest
# value is 65504 and whose smallest normal one is 6e-5: small gradients would round to 0. Dynamic
# loss scaling multiplies the loss by a large scale S (65536 to start) before backward, so every
# gradient is S times bigger and stays representable; scaler.step() divides them by S again (unscale)
# before the optimizer's step.
# Too big an S makes some gradient overflow to inf instead. scaler.step() checks every gradient
# for inf/NaN first: if it finds one, it does not call optimizer.step() at all (the parameters stay
# as they were), and scaler.update() halves S (backoff_factor 0.5). After growth_interval (2000)
# steps in a row without inf it doubles S again: S settles just under where gradients overflow.
# Here step 3 gets a batch of outliers (inputs × 20): the loss is still finite (18.3), but its
# gradients × 65536 pass 65504 in float16 backward. That step is skipped and the scale goes
# 65536 -> 32768; steps 4 and 5 run with 32768. The Calls list marks call #3 "step skipped".
# The gradient norms recorded after each backward are of the scaled gradients (S times the true
# ones: ~3e4 here); call #3's are inf.
# On a GPU: torch.autocast("cuda", ...) and torch.amp.GradScaler("cuda"); the same on a CPU here.
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.amp.GradScaler("cpu")
inputs = torch.randn(32, 8)
targets = 0.1 * inputs.sum(dim=1, keepdim=True)

for step in range(6):
    x = inputs * 20 if step == 3 else inputs  # step 3: a batch of outliers
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        pred = model(x)  # float16
    loss = nn.functional.mse_loss(pred.float(), targets)  # the loss in float32
    scale = scaler.get_scale()
    scaler.scale(loss).backward()  # backward of loss × scale
    scaler.step(optimizer)  # unscale; skip optimizer.step() if a gradient is inf/NaN
    scaler.update()  # halve the scale after a skip
    print(f"step {step}  loss {loss.item():.3g}  scale {scale:g} -> {scaler.get_scale():g}")
