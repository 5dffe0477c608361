"""Small real models for the tests: tiny transformers configs and hand-written modules."""

from __future__ import annotations

import torch
from torch import nn


def gpt2_config():  # type: ignore[no-untyped-def]
    import transformers

    return transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=100,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
        architectures=["GPT2LMHeadModel"],
    )


def llama_config():  # type: ignore[no-untyped-def]
    import transformers

    return transformers.LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
        architectures=["LlamaForCausalLM"],
    )


def bert_config():  # type: ignore[no-untyped-def]
    import transformers

    return transformers.BertConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        vocab_size=100,
        max_position_embeddings=64,
        architectures=["BertModel"],
    )


def t5_config():  # type: ignore[no-untyped-def]
    import transformers

    return transformers.T5Config(
        d_model=32,
        d_ff=64,
        d_kv=8,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        vocab_size=100,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        architectures=["T5ForConditionalGeneration"],
    )


def real(config):  # type: ignore[no-untyped-def]
    """The real (CPU) model of a transformers config, in eval mode, seeded."""
    import transformers

    torch.manual_seed(0)
    cls = getattr(transformers, config.architectures[0]) if config.architectures else None
    model = cls(config) if cls else transformers.AutoModel.from_config(config)
    return model.eval()


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class SmallLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.lstm = nn.LSTM(16, 24, num_layers=2, batch_first=True)
        self.out = nn.Linear(24, 5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(ids))
        return self.out(h[:, -1])


class Reused(nn.Module):
    """One Linear called three times on inputs of different batch sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.shared(x)
        b = self.shared(torch.cat([a, a]))
        c = self.shared(torch.cat([b, b]))
        return self.head(c)


class DictModel(nn.Module):
    """Takes a dict of tensors, returns a dict with a nested tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.image = nn.Linear(12, 6)
        self.text = nn.Embedding(20, 6)
        self.fuse = nn.Bilinear(6, 6, 4)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, object]:
        img = self.image(batch["image"])
        txt = self.text(batch["tokens"]).mean(1)
        fused = self.fuse(img, txt)
        return {"fused": fused, "parts": (img, txt)}


class Failing(nn.Module):
    """A model whose ``inner.block`` does something meta tensors cannot do (``how``)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.inner = nn.Sequential()
        self.inner.add_module("block", _FailingBlock(how))
        self.post = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.inner(self.pre(x)))


class _FailingBlock(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.proj = nn.Linear(4, 4) if how != "shape" else nn.Linear(5, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "item":
            scale = x.sum().item()  # FAIL-LINE item
            return self.proj(x) * scale
        if self.how == "nonzero":
            picked = x[x > 0]  # FAIL-LINE nonzero
            return self.proj(x) + picked.sum()
        if self.how == "cpu":
            stats = x.cpu()  # FAIL-LINE cpu
            return self.proj(x) + stats.mean()
        return self.proj(x)  # FAIL-LINE shape


def fail_line(how: str) -> int:
    """The line number of the ``FAIL-LINE how`` marker in this file."""
    with open(__file__, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if text.rstrip().endswith(f"# FAIL-LINE {how}"):
                return number
    raise LookupError(how)
