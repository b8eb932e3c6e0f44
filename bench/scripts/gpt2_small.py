# GPT-2 small (124M parameters, random init: nothing is downloaded), forward, language-model loss
# and backward on one batch (1 x 32 tokens; GPT2_BATCH="4x128" for another size). Needs `transformers`.
# GPT2_TIMES=FILE appends the seconds (wall and CPU) of building the model and of forward + backward.
import json
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
device = os.environ.get("BACKPROP_STUDIO_DEVICE", "cpu")
batch, tokens = (int(n) for n in os.environ.get("GPT2_BATCH", "1x32").split("x"))
clock = (time.perf_counter(), time.process_time())
model = GPT2LMHeadModel(GPT2Config()).to(device)
ids = torch.randint(0, model.config.vocab_size, (batch, tokens), device=device)
built = (time.perf_counter(), time.process_time())
out = model(input_ids=ids, labels=ids)
loss = out.loss
loss.backward()
done = (time.perf_counter(), time.process_time())
print(f"loss {loss.item():.4f}")
if os.environ.get("GPT2_TIMES"):
    with open(os.environ["GPT2_TIMES"], "a") as f:
        f.write(json.dumps({"build": [b - a for a, b in zip(clock, built)],
                            "step": [b - a for a, b in zip(built, done)]}) + "\n")
