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


def test_unknown_model_name_fails_fast_listing_the_builtins(monkeypatch):
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(FileNotFoundError, match="not a built-in model .smollm2-135m, tiny, tiny-llama"):
        models.check_model("no-such-org/no-such-model")
    assert time.monotonic() - start < 10


def test_interrupted_cache_conversion_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("GKV_TRAIN_CACHE", str(tmp_path))
    stale = tmp_path / "tiny-llama-seed0-v1.tmp999999999"  # a conversion killed with its process
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"0" * 1024)

    class Interrupted:
        def save_pretrained(self, path):
            (path / "part").parent.mkdir(parents=True, exist_ok=True)
            (path / "part").write_text("half")
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        models._save_atomically(tmp_path / "converted", Interrupted())
    models.load_model("tiny")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"tiny-llama-seed0-v{models.TINY_VERSION}"]
