# BERT base for sequence classification (random init: nothing is downloaded), 3 labels, a batch of
# 2 x 32 tokens, forward, cross-entropy loss and backward. Needs `transformers`.
import torch
from transformers import BertConfig, BertForSequenceClassification

torch.manual_seed(0)
model = BertForSequenceClassification(BertConfig(num_labels=3))
ids = torch.randint(0, model.config.vocab_size, (2, 32))
out = model(input_ids=ids, labels=torch.tensor([0, 2]))
loss = out.loss
loss.backward()
print(f"loss {loss.item():.4f}")
