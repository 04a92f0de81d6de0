"""Limits a job checks before any work, from the model's configuration and tokenizer (never its weights).

``check_generations`` checks that the model's logits are its LM head's (``check_plain_head``) and every kind of
``generate`` call a job will make: each prompt plus its new tokens within the model's context
(``max_position_embeddings``), what each method asks of the model and the prompts (``Method.check_model``,
``Method.check_prompts``: S4R's ranks, prompts longer than its sinks, a kept prompt within the budget), and the
memory the rollout's cache and record will take (``Method.cache_bytes``) within the memory free on the device.
"""

from __future__ import annotations

import functools
import os
import resource
import sys
from dataclasses import dataclass

from gkv_rollout.config import CompressionConfig
from gkv_rollout.contract.attention import check_plain_head
from gkv_rollout.methods import ModelShape
from gkv_train.storage import size_text

NEAR_LIMIT = 64  # tokens: prompts estimated this close to the context are tokenised exactly (chat template)
GIVEN_COUNTED = 100_000  # characters: a given beginning up to this long is counted exactly even when far too long


class WeightlessModel:
    """A model as the checks before any work read it: its ``name`` (as given, for messages), its configuration and
    tokenizer (``load_config_and_tokenizer``: never its weights), read on first use and once, so that the checks
    that need none of it (the output folder, the data) come first as before, and no check reads it again."""

    def __init__(self, name: str):
        self.name = name

    @functools.cached_property
    def _read(self) -> tuple:
        from gkv_train.models import load_config_and_tokenizer

        return load_config_and_tokenizer(self.name)

    @property
    def config(self):
        return self._read[0]

    @property
    def tokenizer(self):
        return self._read[1]

    @property
    def shape(self) -> ModelShape:
        return ModelShape.of(self.name, self.config)


@dataclass
class Generation:
    """One kind of ``generate`` (or replay) call of a job: ``what`` it is (for messages), its ``prompts`` (texts or
    token ids, as the engine receives them) with their problem ``ids``, ``rows`` sequences per call (``rows_key``:
    the settings that set them), the new tokens of each prompt (``new_tokens``: one count for all, or one per prompt
    for replayed completions; ``key``: the setting that sets them) and the ``compressions`` it runs under."""

    what: str
    prompts: list[str]
    ids: list
    rows: int
    new_tokens: int | list[int]
    compressions: list[CompressionConfig]
    key: str = "max_completion_length"
    given: list[str] | None = None  # per prompt, the text its completions begin with (long_recall's story)
    given_key: str = "data"  # the configuration group of the problems (for messages)
    rows_key: str = "prompts_per_step / batch_problems, num_generations"


def check_generations(
    model: WeightlessModel, generations: list[Generation], dtype_bytes: int, device: str, processes: int = 1
) -> None:
    """Every limit of ``generations`` on ``model`` (see the module's docstring), before it loads: ValueError naming
    the first limit exceeded. ``dtype_bytes``: bytes of a cache entry (the dtype the model is loaded in);
    ``processes``: processes on this machine generating alike (CPU: they share its memory)."""
    check_plain_head(model.config, f"model={model.name}")
    shape, tokenizer = model.shape, model.tokenizer
    need, biggest, counted = 0, None, {}
    # the prompt lengths from which a method refuses a prompt: prompts near one are counted exactly
    limits = {c.resolved.prompt_limit() for g in generations for c in g.compressions} - {None}
    for gen in generations:
        check_ranks(shape, gen.compressions)
        if not gen.prompts:
            continue
        texts = tuple(p if isinstance(p, str) else tuple(p) for p in gen.prompts)
        lengths, skipped = counted[texts] = counted.get(texts) or prompt_tokens(
            tokenizer, gen.prompts, shape.context, limits
        )
        new = gen.new_tokens if isinstance(gen.new_tokens, list) else [gen.new_tokens] * len(lengths)
        if shape.context is not None:
            check_context(shape, gen, lengths, skipped, new)
        if gen.given is not None:
            check_given(tokenizer, gen, new, None if shape.context is None else [shape.context - n for n in lengths])
        for compression in gen.compressions:
            method = compression.resolved
            method.check_prompts(lengths, lambda i: f"the prompt of problem {gen.ids[i]} in the {gen.what}")
            method.check_lengths(shape, min(lengths), min(new))
            size = method.cache_bytes(shape, gen.rows, max(lengths), max(new), dtype_bytes)
            if size > need:
                need, biggest = size, (gen, compression)
    if biggest is not None:
        check_memory(shape, need * (processes if device == "cpu" else 1), biggest, device, processes)


def check_task_contexts(model: WeightlessModel, datas: dict) -> None:
    """The prompt length a generated task is asked for (``<key>.context`` of the retrieval tasks, ``datas``: key
    -> ``DataConfig``) within ``model``'s context, checked before the prompts are built: a prompt of a billion
    tokens would exhaust the machine's memory long before the context check of ``check_generations``."""
    from gkv_train.problems.retrieval import RETRIEVAL_TASKS

    asked = {key: data.context for key, data in datas.items() if data is not None and data.name in RETRIEVAL_TASKS}
    if not asked:
        return
    shape = model.shape
    for key, context in asked.items():
        if shape.context is not None and context > shape.context:
            raise ValueError(
                f"{key}.context={context} exceeds {model.name}'s context of {shape.context} tokens "
                f"(max_position_embeddings): at most {shape.context}, less the new tokens"
            )


def check_lora_targets(model: WeightlessModel, lora) -> None:
    """``lora.target_modules`` (``LoraOptions``, enabled) against ``model``'s modules, before it loads: PEFT's own
    injection of the adapters into the model built from its configuration on the meta device (no weights), so its
    checks run as they will (a name no module has, a module of a kind LoRA cannot adapt), and TRL's (no adapter on
    the LM head, from whose weight the log-probs are computed directly). ValueError naming the key and the model's
    linear layers."""
    import torch
    from peft import LoraConfig, inject_adapter_in_model
    from peft.tuners.tuners_utils import BaseTunerLayer
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(model.config)
    linear = sorted({name.rsplit(".", 1)[-1] for name, m in built.named_modules() if isinstance(m, torch.nn.Linear)})
    given = f"lora.target_modules={list(lora.target_modules)}"
    adapters = LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=list(lora.target_modules))
    try:
        inject_adapter_in_model(adapters, built, low_cpu_mem_usage=True)
    except ValueError as err:  # PEFT's NoMatchingPeftModuleError is one
        raise ValueError(
            f"{given} does not fit {model.name} ({' '.join(str(err).split())[:200]}); its linear layers: "
            f"{', '.join(linear)}"
        ) from None
    if isinstance(built.get_output_embeddings(), BaseTunerLayer):
        raise ValueError(
            f"{given} puts an adapter on the LM head ({built.get_output_embeddings().__class__.__name__}), which TRL "
            "never trains (its log-probs use the head's weight directly): leave lm_head out"
        )


def check_ranks(shape: ModelShape, compressions: list[CompressionConfig]) -> None:
    """Each method's options within what the model allows (``Method.check_model``: S4R's ranks and full layers)."""
    for c in compressions:
        c.resolved.check_model(shape)


def prompt_tokens(
    tokenizer, prompts: list[str], context: int | None, limits: set[int] = frozenset()
) -> tuple[list[int], set[int]]:
    """(tokens of each prompt as the rollout engine encodes it (chat template; token ids pass through), the
    indices of prompts too long to count). A text far longer than ``context`` could hold is not tokenised (more
    characters than 2 x the longest vocabulary entry per token): it counts as ``context + 1``. The others are
    counted in one batch plus the template's tokens, and those near ``context`` or within ``NEAR_LIMIT`` of one of
    ``limits`` exactly."""
    from gkv_rollout.engine import encode_prompts

    given = {i: len(p) for i, p in enumerate(prompts) if not isinstance(p, str)}  # token ids
    longest_token = max(len(t) for t in tokenizer.get_vocab()) if context is not None else 0
    skipped = {i for i, p in enumerate(prompts) if context is not None and len(p) > 2 * longest_token * context}
    skipped -= set(given)
    template = len(encode_prompts(tokenizer, ["x"])[0]) - 1  # the chat template's own tokens
    texts = ["" if i in skipped or i in given else p for i, p in enumerate(prompts)]
    plain = tokenizer(texts, add_special_tokens=False)
    lengths = []
    for i, (prompt, ids) in enumerate(zip(prompts, plain["input_ids"])):
        if i in given:
            lengths.append(given[i])
            continue
        estimate = context + 1 if i in skipped else len(ids) + template
        near = (context is not None and estimate >= context - NEAR_LIMIT) or any(
            abs(estimate - limit) <= NEAR_LIMIT for limit in limits
        )
        if i not in skipped and near:
            estimate = len(encode_prompts(tokenizer, [prompt])[0])
        lengths.append(estimate)
    return lengths, skipped


def check_context(shape: ModelShape, gen: Generation, lengths: list[int], skipped: set[int], new: list[int]) -> None:
    """Each prompt of ``gen`` plus its new tokens within ``shape.context``; ValueError naming the longest prompt,
    or ``gen.key`` when it is the new tokens that do not fit."""
    context = shape.context
    totals = [n + m for n, m in zip(lengths, new)]
    worst = max(range(len(totals)), key=totals.__getitem__)
    if totals[worst] <= context:
        return
    where = f"{shape.name}'s context of {context} tokens (max_position_embeddings)"
    over = sum(t > context for t in totals)
    size = f"{len(gen.prompts[worst])} characters" if worst in skipped else f"{lengths[worst]} tokens"
    room = context - max(lengths)
    if len(set(new)) == 1 and max(lengths) < context and over == len(totals):
        raise ValueError(
            f"{gen.key}={new[0]} does not fit {where} after any prompt of the {gen.what}: at most "
            f"{room} does after the longest ({max(lengths)} tokens)"
        )
    fix = f"lower {gen.key} to at most {room}" if room > 0 and len(set(new)) == 1 else "shorten the prompts"
    raise ValueError(
        f"the {gen.what}: the prompt of problem {gen.ids[worst]} ({size}) plus {new[worst]} new tokens ({gen.key}) "
        f"exceeds {where}; {over} of {len(totals)} prompts do: drop them (data.limit, another data file) or {fix}"
    )


def check_given(tokenizer, gen: Generation, new: list[int], room: list[int] | None = None) -> None:
    """Each prompt's given beginning (``gen.given``: the text its completions begin with, fed as if sampled) shorter
    than its new tokens, so that something is sampled after it; ValueError naming the problem, the beginning's
    length and both keys, advising to raise the new tokens only where the model's context leaves room for them
    after the prompt (``room``, per prompt: context less the prompt's tokens; None: no limit). A text longer than
    its new tokens could be in the fewest tokens possible (its characters over the longest vocabulary entry's) and
    longer than ``GIVEN_COUNTED`` characters is not tokenised."""
    longest_token = max(len(t) for t in tokenizer.get_vocab())
    cheap = [len(text) // longest_token for text in gen.given]
    counted = [i for i, least in enumerate(cheap) if least < new[i] or len(gen.given[i]) <= GIVEN_COUNTED]
    ids = tokenizer([gen.given[i] for i in counted], add_special_tokens=False)["input_ids"] if counted else []
    exact = dict(zip(counted, ids))
    for i, limit in enumerate(new):
        size = len(exact[i]) if i in exact else cheap[i]
        if size >= limit:
            what = f"{size} tokens" if i in exact else f"at least {size} tokens ({len(gen.given[i])} characters)"
            fix = f"raise {gen.key} above it (with room for the answer) or lower {gen.given_key}.sentences"
            if room is not None and size >= room[i]:  # no new-token count fits it and an answer in the context
                fix = (
                    f"lower {gen.given_key}.sentences: the model's context (max_position_embeddings) leaves "
                    f"{room[i]} tokens after the prompt, too few for it and an answer"
                )
            raise ValueError(
                f"the {gen.what}: the given beginning of problem {gen.ids[i]}'s completions (long_recall's story, "
                f"{gen.given_key}.sentences) is {what}, which leaves nothing to sample within {gen.key}={limit}: {fix}"
            )


def rollout_bytes(shape: ModelShape, c: CompressionConfig, rows: int, prompt: int, new: int, dtype_bytes: int) -> int:
    """Estimated bytes of one rollout's cache, record and per-token buffers: ``rows`` sequences of ``prompt``
    (the padded width) + ``new`` tokens under the compression ``c``, cache entries of ``dtype_bytes``
    (``Method.cache_bytes``)."""
    return c.resolved.cache_bytes(shape, rows, prompt, new, dtype_bytes)


def available_memory(device: str) -> tuple[int, str]:
    """(bytes this process can still allocate, where): a GPU's free memory; on CPU the least of the kernel's
    MemAvailable, the cgroup's limit less its usage, and the address-space limit (``ulimit -v``) less what the
    process maps."""
    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0], f"GPU {torch.cuda.current_device()} ({torch.cuda.get_device_name()})"
    found = [(_meminfo("MemAvailable"), "memory available on this machine (MemAvailable)")]
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        found.append((limit - used, "memory left in this container's limit (cgroup memory.max)"))
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        found.append((soft - (status_bytes("VmSize") or 0), "address space left under ulimit -v"))
    return min((f for f in found if f[0] is not None), key=lambda f: f[0])


def check_memory(shape: ModelShape, need: int, biggest: tuple, device: str, processes: int) -> None:
    """ValueError when ``need`` bytes (the largest rollout, ``biggest`` = (generation, compression)) exceed what
    ``device`` has free; a warning above half of it."""
    free, where = available_memory(device)
    gen, compression = biggest
    share = f" x {processes} processes" if processes > 1 and device == "cpu" else ""
    what = (
        f"the {gen.what} ({gen.rows} sequences{share}, {compression.method} cache, {gen.key}="
        f"{gen.new_tokens if isinstance(gen.new_tokens, int) else max(gen.new_tokens)}) needs about "
        f"{size_text(need)} for {shape.name}'s KV cache and record"
    )
    if need > free:
        raise ValueError(
            f"{what}, more than the {size_text(free)} of {where}: lower {gen.key}, the rows per call ({gen.rows_key}) "
            "or the compression budget"
        )
    if need > free / 2:
        print(f"warning: {what}: over half the {size_text(free)} of {where}", file=sys.stderr)


def _meminfo(key: str) -> int | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def _read_int(path: str) -> int | None:
    try:
        text = open(path).read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def status_bytes(field: str) -> int | None:
    """A memory figure of this process from /proc/self/status in bytes (``VmRSS``: resident now; ``VmHWM``: its
    peak since the process started or ``reset_peak_resident``; ``VmSize``: address space); None where the system
    does not say (not Linux)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_resident() -> bool:
    """Start ``VmHWM`` again from the resident memory now (Linux: /proc/self/clear_refs); False where it cannot
    (then ``VmHWM`` is the process's lifetime peak, no measure of what follows)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True
