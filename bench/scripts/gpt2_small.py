# GPT-2 small (124M parameters, random init: nothing is downloaded), one batch of 1 x 32 tokens,
# forward, language-model loss and backward. Needs `transformers`.
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config())
ids = torch.randint(0, model.config.vocab_size, (1, 32))
out = model(input_ids=ids, labels=ids)
loss = out.loss
loss.backward()
print(f"loss {loss.item():.4f}")
