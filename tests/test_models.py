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


@pytest.mark.smollm2
def test_gguf_copy_is_shared_across_installs(smollm2, tmp_path):
    """The converted copy is keyed by the GGUF's content, not its path: each venv or clone installs its own file,
    and a path key left a 517 MB copy per clone in the cache until the disk filled."""
    import shutil

    original = smollm2_gguf()
    elsewhere = tmp_path / "another-venv" / original.name
    elsewhere.parent.mkdir()
    shutil.copyfile(original, elsewhere)  # another path and modification time, the same content

    def copies():  # of this file (other tests may add the tiny models' meanwhile)
        return sorted(p.name for p in models.cache_root().glob(f"{original.stem}-*"))

    before = copies()
    model, _ = models.load_model(str(elsewhere), dtype=torch.bfloat16)
    assert copies() == before  # no second conversion
    assert model.name_or_path == smollm2[0].name_or_path
    assert torch.equal(
        model.model.layers[3].mlp.down_proj.weight, smollm2[0].model.layers[3].mlp.down_proj.weight.bfloat16()
    )
    data = bytearray(elsewhere.read_bytes())
    data[len(data) // 2] ^= 1  # control: other content in the middle, same size and name, is another copy
    elsewhere.write_bytes(bytes(data))
    assert models._gguf_cache_dir(elsewhere) != models._gguf_cache_dir(original)


def test_gguf_copy_is_float32_whatever_the_first_load_asks(tmp_path, monkeypatch):
    """The first load of a GGUF converts it and keeps the copy; asked for bfloat16, it still keeps float32, else every
    later float32 load would read bf16-rounded weights. The conversion itself is the tiny model here (the real one
    takes a minute; test_smollm2_loads_trainable_with_gguf_eos runs it)."""
    from safetensors import safe_open

    from gkv_train.models import tiny_tokenizer

    def from_pretrained(directory, gguf_file=None, dtype=torch.float32, **kwargs):
        assert gguf_file is not None, "only the conversion is replaced; the copy is reloaded for real"
        return tiny_model("tiny-llama", dtype=dtype)

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    monkeypatch.setenv("GKV_TRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "gguf_special_tokens", lambda path: {})
    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", lambda directory, gguf_file=None: tiny_tokenizer())
    real_model_load = models.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(
        models.AutoModelForCausalLM,
        "from_pretrained",
        lambda directory, **kw: (
            from_pretrained(directory, **kw) if "gguf_file" in kw else real_model_load(directory, **kw)
        ),
    )
    model, _ = models.load_model(str(gguf), dtype=torch.bfloat16)
    assert model.dtype == torch.bfloat16
    with safe_open(models._gguf_cache_dir(gguf) / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}


@pytest.mark.parametrize("damage", ["cut", "garbage", "no-config"])
def test_damaged_cache_copy_is_made_again_with_a_warning(tmp_path, monkeypatch, caplog, damage):
    """A converted copy damaged after it was written (a cut model.safetensors, a garbled config.json) is removed and
    made again from its source, with a warning naming it; before, every later load failed on it."""
    monkeypatch.setenv("GKV_TRAIN_CACHE", str(tmp_path))
    model, _ = models.load_model("tiny")
    first = [p.detach().clone() for p in model.parameters()]
    del model  # its weights map the file: cutting it under them would be a bus error, not the damage tested
    (copy,) = tmp_path.iterdir()
    if damage == "cut":
        weights = copy / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "garbage":
        (copy / "config.json").write_text("{not json")
    else:
        (copy / "config.json").unlink()
    with caplog.at_level("WARNING", logger="gkv_train.models"):
        again, _ = models.load_model("tiny")
    assert f"{copy} is damaged" in caplog.text
    assert all(torch.equal(p, q) for p, q in zip(first, again.parameters()))
    assert models.load_model("tiny")[0] is not None and (copy / "config.json").is_file()


def test_a_sound_copy_that_fails_to_load_is_kept_and_the_error_raised(tmp_path, monkeypatch):
    """Only damage removes a copy: another error loading a sound one (here, one the loader raises) is the caller's,
    and the copy stays."""
    monkeypatch.setenv("GKV_TRAIN_CACHE", str(tmp_path))
    models.load_model("tiny")
    (copy,) = tmp_path.iterdir()

    def refuse(directory, dtype):
        raise ValueError("an unsupported configuration field")

    monkeypatch.setattr(models, "_from_dir", refuse)
    with pytest.raises(ValueError, match="unsupported configuration field"):
        models.load_model("tiny")
    assert (copy / "config.json").is_file() and (copy / "model.safetensors").is_file()
