"""The ``experts`` row's own active parameters (issue 36's blind spots): ``k/E`` of its
parameters, from the real model's named parameters (``test_moe.truth``), not only its
ancestors' rows reduced."""

from __future__ import annotations

import torch
import transformers
from test_moe import experts_of, mixtral, qwen3_moe, truth

import meta_widget as mw


def test_the_experts_rows_own_active_params_are_k_over_e() -> None:
    for config in (mixtral(), qwen3_moe()):
        torch.manual_seed(0)
        real = transformers.AutoModel.from_config(config)
        k, experts = config.num_experts_per_tok, experts_of(config)
        frame = mw.analyze(config).to_dataframe().set_index("module")
        rows = [p for p in frame.index if p.endswith(".experts")]
        assert rows, list(frame.index)
        for path in rows:
            held = sum(p.numel() for n, p in real.named_parameters() if n.startswith(path + "."))
            assert frame.loc[path, "params"] == held
            assert (
                frame.loc[path, "active_params"]
                == truth(real, k, experts, path)
                == (held * k // experts)
            ), path
