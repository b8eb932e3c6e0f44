"""Popular model families under capture: the script's own outputs and gradients equal a plain run.

Each script is run twice in this process with the same seed: once as plain Python
(``runpy``) and once under capture; the loss, the outputs and every parameter's ``.grad``
must be bitwise equal, and the capture must hold a graph. ``transformers`` models use tiny
random-init configs (no download); the full-size ones are in ``bench/``.
"""

import os
import runpy
import textwrap

import pytest

torch = pytest.importorskip("torch")

from core.worker.capture.recorder import Capture  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BERT = """\
    from transformers import BertConfig, BertForSequenceClassification
    model = BertForSequenceClassification(BertConfig(
        num_labels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, vocab_size=100, max_position_embeddings=32))
    ids = torch.randint(0, 100, (2, 8))
    out = model(input_ids=ids, labels=torch.tensor([0, 2]))
    loss = out.loss
    loss.backward()
    """

GPT2 = """\
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32))
    ids = torch.randint(0, 100, (2, 8))
    out = model(input_ids=ids, labels=ids)
    loss = out.loss
    loss.backward()
    """

T5 = """\
    from transformers import T5Config, T5ForConditionalGeneration
    model = T5ForConditionalGeneration(T5Config(
        vocab_size=100, d_model=32, d_ff=64, d_kv=16, num_layers=2, num_heads=2, decoder_start_token_id=0))
    ids = torch.randint(1, 100, (2, 8))
    labels = torch.randint(1, 100, (2, 5))
    out = model(input_ids=ids, labels=labels)
    loss = out.loss
    loss.backward()
    """

CNN = """\
    from torch import nn
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))
    images = torch.randn(4, 3, 16, 16)
    out = model(images)
    loss = nn.functional.cross_entropy(out, torch.tensor([0, 1, 2, 3]))
    loss.backward()
    """

LSTM = """\
    from torch import nn
    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(20, 8)
            self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
            self.head = nn.Linear(16, 4)
        def forward(self, tokens):
            hidden, _ = self.lstm(self.embed(tokens))
            return self.head(hidden)
    model = Tagger()
    tokens = torch.randint(0, 20, (3, 7))
    out = model(tokens)
    loss = out.logsumexp(-1).mean()
    loss.backward()
    """

CHECKPOINT = """\
    from torch import nn
    from torch.utils.checkpoint import checkpoint
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(3))
        def forward(self, x):
            for block in self.blocks:
                x = x + checkpoint(block, x, use_reentrant=False)
            return x
    model = Net()
    x = torch.randn(4, 16, requires_grad=True)
    out = model(x)
    loss = out.pow(2).mean()
    loss.backward()
    """

SDPA = """\
    from torch import nn
    import torch.nn.functional as F
    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(16, 48)
            self.proj = nn.Linear(16, 16)
        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 6, 3, 2, 8).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(2, 6, 16))
    model = Attention()
    x = torch.randn(2, 6, 16)
    out = model(x)
    loss = out.square().sum()
    loss.backward()
    """


def _run_both(tmp_path, body: str):
    script = tmp_path / "model_script.py"
    script.write_text("import torch\ntorch.manual_seed(0)\n" + textwrap.dedent(body))
    plain = runpy.run_path(str(script), run_name="__main__")
    capture = Capture(str(script))
    trace = capture.run()
    return plain, capture.namespace, trace


def _outputs(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if hasattr(value, "to_tuple"):  # transformers' ModelOutput
        value = value.to_tuple()
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _outputs(v)]
    return []


def _assert_same(plain: dict, captured: dict, trace) -> None:
    assert trace.error is None, trace.error.message
    assert trace.calls and trace.calls[0].api == "Tensor.backward" and trace.calls[0].node_count > 10
    assert torch.equal(plain["loss"], captured["loss"])
    outs_plain, outs_captured = _outputs(plain["out"]), _outputs(captured["out"])
    assert len(outs_plain) == len(outs_captured) > 0
    for a, b in zip(outs_plain, outs_captured):
        assert torch.equal(a, b)
    params_plain = dict(plain["model"].named_parameters())
    params_captured = dict(captured["model"].named_parameters())
    assert params_plain.keys() == params_captured.keys()
    with_grad = 0
    for name, p in params_plain.items():
        q = params_captured[name]
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            with_grad += 1
            assert torch.equal(p.grad, q.grad), name
    assert with_grad > 0
    # The trace's own leaf gradients are the script's.
    call = trace.calls[0]
    for name, values in call.leaf_grads.items():
        if values.data is not None and name in params_captured:
            expected = params_captured[name].grad.reshape(-1)
            assert torch.equal(torch.tensor(values.data, dtype=expected.dtype), expected), name


@pytest.mark.parametrize("body", [BERT, GPT2, T5], ids=["bert", "gpt2", "t5"])
def test_transformers_models_match_plain_run(tmp_path, body):
    pytest.importorskip("transformers")
    _assert_same(*_run_both(tmp_path, body))


@pytest.mark.parametrize("body", [CNN, LSTM, CHECKPOINT, SDPA], ids=["cnn", "lstm", "checkpoint", "sdpa"])
def test_torch_models_match_plain_run(tmp_path, body):
    _assert_same(*_run_both(tmp_path, body))


def test_bert_names_its_parameters_and_modules(tmp_path):
    pytest.importorskip("transformers")
    _, _, trace = _run_both(tmp_path, BERT)
    call = trace.calls[0]
    leaves = {n.label for n in call.nodes if n.kind == "accumulate_grad"}
    assert "bert.encoder.layer.0.attention.self.query.weight" in leaves
    assert "classifier.bias" in leaves
    modules = {n.module for n in call.nodes if n.module}
    assert "bert.encoder.layer.1.output.dense" in modules
