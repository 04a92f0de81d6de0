import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gkv_train import model_cache, models
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
        model_cache.save_copy(tmp_path / "converted", [Interrupted()], {})
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
        return sorted(p.name for p in model_cache.cache_root().glob(f"{original.stem}-*"))

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
    assert model_cache.gguf_copy(elsewhere) != model_cache.gguf_copy(original)


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
    with safe_open(model_cache.gguf_copy(gguf) / "model.safetensors", "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}


@pytest.mark.parametrize("kept", [60_000_000, 20])
def test_a_cut_gguf_file_is_named_as_damaged_before_transformers_reads_it(tmp_path, monkeypatch, kept):
    """The SmolLM2 GGUF cut to its first ``kept`` bytes (a download or copy cut short): once numpy's "cannot reshape
    array of size 427712 into shape (1536,360)" from transformers' reader, naming nothing; now the checks before any
    work (``load_config_and_tokenizer``) and ``load_model`` name the file as damaged, before any conversion."""
    cut = tmp_path / "cut.gguf"
    with open(smollm2_gguf(), "rb") as f:
        cut.write_bytes(f.read(kept))
    monkeypatch.setenv("GKV_TRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("converted"))
    for read in (models.load_config_and_tokenizer, models.load_model):
        with pytest.raises(ValueError, match=rf"model file {cut} is damaged \(cut short, or not a GGUF file"):
            read(str(cut))


def damage_copy(copy, how: str) -> None:
    """Damage a converted copy after it was written, as ``how`` says."""
    weights = copy / "model.safetensors"
    if how == "cut":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif how == "zeroed":  # the same size, a region inside the tensors zeroed: only the manifest's SHA-256 sees it
        with open(weights, "r+b") as f:
            f.seek(weights.stat().st_size // 2)
            f.write(bytes(64 << 10))
    elif how == "garbage":
        (copy / "config.json").write_text("{not json")
    elif how == "added":
        (copy / "model-00002-of-00002.safetensors").write_bytes(b"extra")
    else:  # a file removed: the manifest (a copy of before manifests), the weights, the tokenizer, the configuration
        (
            copy / {"no-manifest": "manifest.json", "no-weights": "model.safetensors"}.get(how, how[3:] + ".json")
        ).unlink()


DAMAGES = ["cut", "zeroed", "garbage", "added", "no-config", "no-manifest", "no-weights", "no-tokenizer"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_cache_copy_is_made_again_with_a_warning(tmp_path, monkeypatch, caplog, damage):
    """A converted copy damaged after it was written (a cut model.safetensors, a zeroed region of the same size, a
    garbled config.json, a file missing or added, no manifest: a copy made before copies carried one) is removed and
    made again from its source, with a warning naming it; before, a zeroed region was loaded as it was (every
    completion changed), a missing tokenizer or weights file failed every load. Control: a sound copy loads with no
    warning."""
    monkeypatch.setenv("GKV_TRAIN_CACHE", str(tmp_path))
    with caplog.at_level("WARNING", logger="gkv_train.model_cache"):
        model, _ = models.load_model("tiny")
        first = [p.detach().clone() for p in model.parameters()]
        del model  # its weights map the file: cutting it under them would be a bus error, not the damage tested
        models.load_model("tiny")
    assert caplog.text == ""
    (copy,) = tmp_path.iterdir()
    damage_copy(copy, damage)
    with caplog.at_level("WARNING", logger="gkv_train.model_cache"):
        again, _ = models.load_model("tiny")
    assert f"{copy} is damaged" in caplog.text
    assert all(torch.equal(p, q) for p, q in zip(first, again.parameters()))
    assert models.load_model("tiny")[0] is not None and model_cache.copy_problem(copy) is None


def read_only(monkeypatch, cache) -> None:
    """The model cache ``cache`` as a read-only file system is (as root, permissions would not stop a write)."""
    real = os.access

    def access(path, mode, **kwargs):
        return not (mode & os.W_OK and Path(path).is_relative_to(cache)) and real(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", access)


@pytest.mark.parametrize("damage", ["zeroed", "no-manifest", "no-config"])
def test_a_damaged_copy_in_a_read_only_cache_is_refused_before_any_conversion(tmp_path, monkeypatch, damage):
    """Where a damaged copy cannot be removed, the checks before any work refuse it, naming the copy and what to do,
    and a load refuses it before converting anything: before, the model was converted again (38 s for SmolLM2) and
    then the damaged copy loaded anyway. Control: a sound copy in a read-only cache passes and loads."""
    from gkv_train.exits import Refused, refusing

    monkeypatch.setenv("GKV_TRAIN_CACHE", str(tmp_path))
    models.load_model("tiny")
    (copy,) = tmp_path.iterdir()
    read_only(monkeypatch, tmp_path)
    models.check_model("tiny")
    assert models.load_model("tiny")[0].name_or_path == str(copy)
    damage_copy(copy, damage)
    monkeypatch.setattr(models, "tiny_model", lambda *a, **k: pytest.fail("converted again"))
    with pytest.raises(Refused, match=f"the converted model {copy} is damaged .* Delete {copy} .*GKV_TRAIN_CACHE"):
        with refusing():
            models.check_model("tiny")
    with pytest.raises(PermissionError, match="cannot be removed"):
        models.load_model("tiny")


def test_a_read_only_cache_without_a_copy_loads_in_memory_with_a_warning(tmp_path, monkeypatch, caplog):
    """A read-only cache without a copy: the model is made in memory with a warning that it is not kept (before:
    silently, every load converting again), and a run that reloads it by path (TRL's reference model, beta > 0)
    is refused before any work. Controls: beta=0 and LoRA need no reload; a writable cache passes."""
    from types import SimpleNamespace

    from gkv_train.training.algorithms import GRPO

    def check_reference_model(run):
        GRPO(run).check_reference_model()

    monkeypatch.setenv("GKV_TRAIN_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    run = SimpleNamespace(beta=0.04, lora=SimpleNamespace(enabled=False), model="tiny")
    check_reference_model(run)
    read_only(monkeypatch, tmp_path / "cache")
    with caplog.at_level("WARNING", logger="gkv_train.model_cache"):
        model, _ = models.load_model("tiny")
    assert "is not writable: the converted model tiny-llama-seed0-v1 is not kept" in caplog.text
    assert model.name_or_path == "" and not any((tmp_path / "cache").iterdir())
    with pytest.raises(ValueError, match="beta=0.04 needs TRL's reference model.*not writable and holds no sound"):
        check_reference_model(run)
    check_reference_model(SimpleNamespace(**{**vars(run), "beta": 0.0}))
    check_reference_model(SimpleNamespace(**{**vars(run), "lora": SimpleNamespace(enabled=True)}))


def test_a_file_size_limit_while_writing_a_copy_names_it_and_leaves_nothing(tmp_path):
    """The file-size limit (ulimit -f) reached while the first load writes its copy: an error naming the copy and
    the limit, and no part of it in the cache (before: safetensors' 'I/O error: File too large' traceback).
    Control: the same load without the limit keeps a sound copy."""
    code = (
        "import resource, sys\nfrom gkv_train.models import load_model\n"
        "if sys.argv[1] == 'limit':\n    resource.setrlimit(resource.RLIMIT_FSIZE, (500_000, 500_000))\n"
        "try:\n    load_model('tiny')\nexcept OSError as err:\n    print(type(err).__name__, err)\n"
    )
    env = {**os.environ, "GKV_TRAIN_CACHE": str(tmp_path)}
    limited = subprocess.run([sys.executable, "-c", code, "limit"], env=env, capture_output=True, text=True)
    assert "DiskFull File too large while writing the converted model tiny-llama-seed0-v1" in limited.stdout
    assert "ulimit -f: 500.0 kB" in limited.stdout and not any(tmp_path.iterdir())
    free = subprocess.run([sys.executable, "-c", code, "free"], env=env, capture_output=True, text=True)
    assert "Error" not in free.stdout and model_cache.copy_problem(tmp_path / "tiny-llama-seed0-v1") is None


@pytest.mark.parametrize("given", ["", "  ", "relative/cache", "~/elsewhere"])
def test_the_cache_folder_is_never_the_current_one(tmp_path, monkeypatch, given):
    """GKV_TRAIN_CACHE empty counts as unset (as XDG reads an empty XDG_CACHE_HOME): before, the copies were
    written into the current folder. A relative or ~ path is made absolute."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GKV_TRAIN_CACHE", given)
    expected = {
        "": Path.home() / ".cache" / "gkv_train",
        "relative/cache": tmp_path / "relative" / "cache",
        "~/elsewhere": Path.home() / "elsewhere",
    }.get(given.strip(), Path.home() / ".cache" / "gkv_train")
    assert model_cache.cache_root() == expected and model_cache.cache_root().is_absolute()


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


def lora_adapter(folder, base, kind="tiny-llama", config=None, **shape):
    """A rank-4 LoRA adapter (q_proj, v_proj) of a tiny model of ``kind`` and ``shape`` in ``folder``, its
    configuration naming ``base`` (and ``config``'s entries written over it)."""
    import json

    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = get_peft_model(tiny_model(kind, **shape), lora)
    with torch.no_grad():  # PEFT starts lora_B at zero: a merged adapter would change nothing
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.1)
    model.save_pretrained(folder)
    written = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(
        json.dumps({**written, "base_model_name_or_path": base, **(config or {})})
    )
    return str(folder)


ADAPTERS = {  # name -> (the adapter's base, kind, its configuration's entries, shape; what the refusal says)
    "other-base": ("tiny-qwen2", "tiny-qwen2", {}, {}, "was trained on tiny-qwen2 (base_model_name_or_path"),
    "no-base": (None, "tiny-llama", {}, {}, "names no base model (base_model_name_or_path)"),
    "more-layers": ("tiny", "tiny-llama", {}, {"num_hidden_layers": 6}, "weights for model.layers.4.self_attn"),
    "wider": ("tiny", "tiny-llama", {}, {"hidden_size": 120}, "q_proj.lora_A.weight is [4, 120], and tiny's"),
    "rank": ("tiny", "tiny-llama", {"r": 8}, {}, "has rank 4, and its adapter_config.json gives model.layers.0"),
    "targets": ("tiny", "tiny-llama", {"target_modules": ["c_attn"]}, {}, "targets 'c_attn' (target_modules"),
}


@pytest.mark.parametrize("case", sorted(ADAPTERS))
def test_an_adapter_that_does_not_fit_is_refused_before_the_model_loads(tmp_path, monkeypatch, case):
    """An adapter trained on another base (its configuration names it), with weights for layers or features the
    model has not, a rank or targets its weights do not have: refused naming the adapter and the model, before the
    model loads. Before, another base's adapter and one with more layers were applied without a word (the extra
    layers dropped), the others failed with PEFT's tracebacks after the model loaded."""
    base, kind, config, shape, message = ADAPTERS[case]
    adapter = lora_adapter(tmp_path / case, base, kind, config, **shape)
    monkeypatch.setenv("GKV_TRAIN_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=f"adapter={adapter}.*model=tiny") as err:
        models.check_adapter(adapter, "tiny")
    assert message in str(err.value)
    monkeypatch.setattr(models, "_load_tiny", lambda *a: pytest.fail("the model loaded before the refusal"))
    with pytest.raises(ValueError, match=re.escape(message)):
        models.load_model("tiny", adapter=adapter)


@pytest.mark.parametrize("named", ["tiny", "tiny-llama", "its copy"])
def test_a_matching_adapter_is_merged_into_its_base(tmp_path, monkeypatch, named):
    """The control: an adapter trained on the model it is applied to (named by its alias, its full name, or the
    folder of its copy in the model cache, as PEFT names the base of ``load_model``'s model) loads merged into it,
    as PEFT merges it."""
    from peft import PeftModel

    monkeypatch.setenv("GKV_TRAIN_CACHE", str(tmp_path / "cache"))
    base = models.load_model("tiny")[0].name_or_path if named == "its copy" else named
    adapter = lora_adapter(tmp_path / "adapter", base)
    models.check_adapter(adapter, "tiny-llama")
    merged, _ = models.load_model("tiny", adapter=adapter)
    expected = PeftModel.from_pretrained(models.load_model("tiny")[0], adapter).merge_and_unload()
    assert not torch.equal(
        merged.model.layers[0].self_attn.q_proj.weight, tiny_model().model.layers[0].self_attn.q_proj.weight
    )
    assert all(torch.equal(p, q) for p, q in zip(merged.parameters(), expected.parameters()))


def test_same_model_compares_names_then_content(tmp_path):
    """An adapter's base and the model given are the same weights when their names resolve alike (an alias, a
    relative path) or their files are the same (a copied GGUF file or model folder); not otherwise."""
    import shutil

    gguf = tmp_path / "a" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(60))
    (tmp_path / "b").mkdir()
    shutil.copyfile(gguf, tmp_path / "b" / "m.gguf")
    folder = tmp_path / "model"
    models.tiny_config().save_pretrained(folder)
    shutil.copytree(folder, tmp_path / "copy")
    assert models.same_model("tiny", "tiny-llama") and not models.same_model("tiny", "tiny-qwen2")
    assert models.same_model(str(gguf), str(tmp_path / "b" / "m.gguf"))
    assert models.same_model(str(folder), str(tmp_path / "copy"))
    assert not models.same_model("org/model-a", "org/model-b") and models.same_model("org/model-a", "org/model-a")
    (tmp_path / "b" / "m.gguf").write_bytes(b"GGUF" + bytes(59) + b"\1")
    (tmp_path / "copy" / "config.json").write_text("{}")
    assert not models.same_model(str(gguf), str(tmp_path / "b" / "m.gguf"))
    assert not models.same_model(str(folder), str(tmp_path / "copy"))
