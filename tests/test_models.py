import importlib.util

import pytest
import torch

from gkv_train import models
from gkv_train.models import SMOLLM2_INSTALL, gguf_special_tokens, smollm2_gguf, tiny_model


def test_missing_embedded_model_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError) as err:
        models.resolve("smollm2-135m")
    assert SMOLLM2_INSTALL in str(err.value)


@pytest.mark.parametrize("kind", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_tiny_models_are_gqa_and_deterministic(kind):
    a, b = tiny_model(kind, seed=3), tiny_model(kind, seed=3)
    cfg = a.config
    assert cfg.num_hidden_layers >= 3 and cfg.num_attention_heads // cfg.num_key_value_heads in (2, 3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


@pytest.mark.smollm2
def test_smollm2_loads_trainable_with_gguf_eos(smollm2):
    model, tokenizer = smollm2
    special = gguf_special_tokens(smollm2_gguf())
    assert special["eos"] == 2
    assert tokenizer.eos_token_id == 2 and tokenizer.pad_token_id == 2
    assert model.generation_config.eos_token_id == 2
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (30, 9, 3, 64)
    # Not marked quantized (Trainer refuses quantized models) and gradients reach the weights.
    assert not getattr(model, "is_quantized", False) and getattr(model, "hf_quantizer", None) is None
    ids = torch.tensor([[1, 20, 30, 40]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grad = model.model.layers[0].self_attn.q_proj.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)
