"""Batched sampling with a compressed KV cache, returning what the trainer needs to reproduce it.

The engine drives an HF causal LM (any model whose attention goes through ``AttentionInterface``: Llama,
Qwen2, Qwen3, ...) token by token with its own cache as attention context (``EvictionCache`` for the G-KV
family, ``S4RCache`` for S4R; any ``gkv_rollout.kv_cache.KVCache`` can be injected). Prompts are left-padded;
every sequence keeps its own logical positions, length and end-of-sequence state.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.contract.attention import use_kv_attention
from gkv_rollout.contract.record import Record, logical_positions
from gkv_rollout.eviction_cache import EvictionCache
from gkv_rollout.kv_cache import KVCache
from gkv_rollout.s4r_cache import S4RCache
from gkv_rollout.sampling import sample_tokens, token_logprobs_of

Prompt = str | Sequence[int] | Sequence[dict]


@dataclass
class RolloutOutput:
    """Result of one batched rollout; rows are prompts repeated ``num_samples`` times, in order.

    sequences, attention_mask: int64 [N, P + C]: left-padded prompts then right-padded completions;
    prompt_lengths, completion_lengths: int64 [N] real tokens (a completion includes its stop token);
    logprobs: float32 [N, C] log-prob of each sampled token under softmax(logits / T), 0 past the end;
    record: what the generated tokens could see (``gkv_rollout.contract.record.Record``): an ``EvictionRecord``
        (``evict_at`` int32 [N, L, Hkv, P + C]) for the G-KV family, an ``S4RRecord`` for s4r, None for full;
    retention: float32 [N] cache length / sequence length at the last token, mean over layers and heads.
    memory_share: float32 [N] the cache's persistent state at each sequence's end / the full KV cache of its
        tokens (eviction: the retention; s4r: sinks, coefficients, query window and bases; full: 1).
    """

    sequences: torch.Tensor
    attention_mask: torch.Tensor
    prompt_lengths: torch.Tensor
    completion_lengths: torch.Tensor
    logprobs: torch.Tensor
    record: Record | None
    retention: torch.Tensor
    memory_share: torch.Tensor
    stats: dict = field(default_factory=dict)

    @property
    def num_completion_tokens(self) -> int:
        return self.logprobs.shape[1]

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.sequences[:, -self.num_completion_tokens :]

    @property
    def completion_mask(self) -> torch.Tensor:
        return self.attention_mask[:, -self.num_completion_tokens :]

    def completions(self) -> list[list[int]]:
        """Each completion's token ids, up to and including its stop token."""
        return [row[:n].tolist() for row, n in zip(self.completion_ids, self.completion_lengths)]

    def prompts(self) -> list[list[int]]:
        """Each prompt's token ids, without padding."""
        width = self.sequences.shape[1] - self.num_completion_tokens
        return [row[width - n : width].tolist() for row, n in zip(self.sequences, self.prompt_lengths)]


CacheFactory = Callable[..., KVCache]  # (model, compression, batch, prompt_width, max_new, device, seed) -> KVCache


def make_cache(
    model, compression: CompressionConfig, batch: int, prompt_width: int, max_new: int, device, seed: int = 0
) -> KVCache:
    """The cache of ``compression.method``: ``S4RCache`` for s4r, else an ``EvictionCache`` sized to the most
    it ever holds (budget + interval tokens after the first compression; everything for ``full``); ``seed``: the
    rollout's sampling seed (the ``random`` method draws from it)."""
    if compression.method == "s4r":
        return S4RCache(model, compression, batch, prompt_width, max_new, device)
    capacity = prompt_width + max_new
    if compression.compresses:
        capacity = min(capacity, max(prompt_width, compression.budget) + compression.resolved().interval)
    dtype = next(model.parameters()).dtype
    return EvictionCache(model.config, compression, batch, capacity, prompt_width + max_new, dtype, device, seed)


def decode_logits(model, ids, positions, mask, cache) -> torch.Tensor:
    """The model's last logits [N, V] for one decode token per sequence ids [N, 1] at positions [N, 1]."""
    out = model(
        input_ids=ids, position_ids=positions, attention_mask=mask, kv_context=cache, use_cache=False, logits_to_keep=1
    )
    return out.logits[:, -1]


@functools.cache
def compiled(fn: Callable, device_type: str) -> Callable:
    """``fn`` under ``torch.compile``, one per function and device type (graphs are reused across rollouts):
    CUDA graphs on a GPU (``reduce-overhead``), Inductor's default elsewhere. Shapes start static; a dimension
    that changes (batch width as finished rows leave, attention width) is made dynamic at the next compile."""
    return torch.compile(fn, mode="reduce-overhead" if device_type == "cuda" else None)


def mark_static(cache) -> None:
    """Tell ``torch.compile`` that the buffers a static decode step writes keep their address (so that a CUDA
    graph may write them in place instead of being skipped for mutating its inputs)."""
    for buffer in cache.step_buffers():
        torch._dynamo.mark_static_address(buffer)


def stop_ids_of(model, tokenizer, sampling: SamplingConfig) -> list[int]:
    """Token ids that end a completion: the configured ones, else the model's (and tokenizer's) EOS."""
    if sampling.stop_token_ids is not None:
        return list(sampling.stop_token_ids)
    eos = model.generation_config.eos_token_id
    ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def encode_prompts(tokenizer, prompts: Sequence[Prompt], chat: bool = True) -> list[list[int]]:
    """Token ids of each prompt: ids pass through; text and message lists go through the chat template
    (when the tokenizer has one and ``chat``), else plain tokenisation."""
    encoded = []
    for prompt in prompts:
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], dict)):
            if tokenizer is None:
                raise ValueError("text prompts need a tokenizer; pass token ids for a model without one")
            if chat and tokenizer.chat_template:
                messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
                text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                encoded.append(tokenizer(text, add_special_tokens=False)["input_ids"])
            else:
                encoded.append(tokenizer(prompt)["input_ids"])
        else:
            encoded.append([int(t) for t in prompt])
        if not encoded[-1]:
            raise ValueError("empty prompt")
    return encoded


def left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token rows: returns (ids int64 [N, P], mask int64 [N, P])."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r) :] = 1
    return ids.to(device), mask.to(device)


class RolloutEngine:
    """Samples completions with a compressed KV cache and records what every generated token could see."""

    def __init__(
        self,
        model,
        tokenizer=None,
        compression: CompressionConfig | None = None,
        chat: bool = True,
        cache_factory: CacheFactory = make_cache,
    ):
        self.model = use_kv_attention(model)
        self.tokenizer = tokenizer
        self.compression = compression or CompressionConfig()
        self.chat = chat
        self.cache_factory = cache_factory

    def pad_id(self) -> int:
        for candidate in (
            getattr(self.tokenizer, "pad_token_id", None),
            self.model.generation_config.pad_token_id,
            self.model.config.pad_token_id,
        ):
            if candidate is not None:
                return int(candidate)
        stop = stop_ids_of(self.model, self.tokenizer, SamplingConfig())
        return stop[0] if stop else 0

    def replay(
        self, prompts: Sequence[Prompt], completions: Sequence[Sequence[int]], sampling: SamplingConfig | None = None
    ) -> RolloutOutput:
        """Teacher-force given completions through the compressed cache, one per prompt.

        Returns what a sampled rollout that produced exactly these tokens returns: the same record, and the
        log-probs of the given tokens under softmax(logits / sampling.temperature). ``sampling.max_new_tokens``
        is the rollout's (at least the longest completion; without ``sampling``: the longest completion): S4R
        solves its rank at prompt + ``max_new_tokens`` unless ``expected_length`` is set.
        """
        if len(completions) != len(prompts):
            raise ValueError(f"{len(completions)} completions for {len(prompts)} prompts")
        if any(len(c) == 0 for c in completions):
            raise ValueError("cannot replay an empty completion")
        longest = max(len(c) for c in completions)
        given = sampling or SamplingConfig(max_new_tokens=longest)
        sampling = dataclasses.replace(given, num_samples=1, max_new_tokens=max(given.max_new_tokens, longest))
        return self.generate(prompts, sampling, forced=completions)

    def generate(
        self,
        prompts: Sequence[Prompt],
        sampling: SamplingConfig | None = None,
        forced: Sequence[Sequence[int]] | None = None,
        progress: Callable[[int], object] | None = None,
    ) -> RolloutOutput:
        """Sample completions (or, with ``forced``, feed the given ones: see ``replay``). The model runs in
        eval mode (no dropout) without gradients; its training mode is restored on return. ``progress``, when
        given, is called after every step with the number of tokens that step generated (e.g. a progress bar's
        ``update``)."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                return self._generate(prompts, sampling or SamplingConfig(), forced, progress)
        finally:
            self.model.train(was_training)

    def _generate(self, prompts, sampling: SamplingConfig, forced, progress) -> RolloutOutput:
        model, cfg = self.model, self.compression
        device = next(model.parameters()).device
        rows = [r for r in encode_prompts(self.tokenizer, prompts, self.chat) for _ in range(sampling.num_samples)]
        pad_id = self.pad_id()
        ids, prompt_mask = left_pad(rows, pad_id, device)
        N, P = ids.shape
        max_new = sampling.max_new_tokens
        if forced is not None:
            forced_lengths = torch.tensor([len(c) for c in forced], device=device)
            forced = torch.tensor([list(c) + [pad_id] * (max_new - len(c)) for c in forced], device=device)
        cache = self.cache_factory(model, cfg, N, P, max_new, device, sampling.seed)
        static = sampling.compile_decode
        if static and not getattr(cache, "static_decode", False):
            raise ValueError(
                f"compile_decode: the {type(cache).__name__} of method {cfg.method!r} has no static decode step "
                "(the full cache and the G-KV family have one)"
            )
        graphs = static and device.type == "cuda"  # CUDA graphs: the buffers the step writes keep their address
        if graphs:
            mark_static(cache)
        step_logits = compiled(decode_logits, device.type) if static else None
        sample = compiled(sample_tokens, device.type) if static else sample_tokens
        logprob_of = compiled(token_logprobs_of, device.type) if static else token_logprobs_of
        stop_ids = torch.tensor(stop_ids_of(model, self.tokenizer, sampling), dtype=torch.long, device=device)
        banned = stop_ids if sampling.ignore_eos and len(stop_ids) else None
        generator = torch.Generator(device=device).manual_seed(sampling.seed)

        tokens = torch.full((N, max_new), pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((N, max_new), dtype=torch.float32, device=device)
        finished = torch.zeros(N, dtype=torch.bool, device=device)
        lengths = torch.zeros(N, dtype=torch.long, device=device)
        prompt_lengths = prompt_mask.sum(-1)

        t0 = time.perf_counter()
        positions = logical_positions(prompt_mask)
        logits = self._forward(cache, ids, positions, prompt_mask.bool())
        cache.after_prefill()
        cache_bytes = 0  # the most the cache held
        t_prefill = time.perf_counter() - t0
        in_cache = torch.arange(N, device=device)  # the rows the cache holds, in its order (finished ones leave)
        drop = sampling.drop_finished_at < 1.0
        steps = 0
        for n in range(max_new):
            if forced is None:
                uniform = None if sampling.temperature == 0 else torch.rand(N, generator=generator, device=device)
                token, logprob = sample(
                    logits, sampling.temperature, sampling.top_p, None if uniform is None else uniform[in_cache], banned
                )
            else:
                token = forced[in_cache, n]
                logprob = logprob_of(logits, token, sampling.temperature)
            live = ~finished[in_cache]
            tokens[in_cache, n] = torch.where(live, token, pad_id)
            logprobs[in_cache, n] = torch.where(live, logprob, 0.0)
            lengths[in_cache] += live.long()
            if progress is not None:
                progress(int(live.sum()))
            stop = torch.isin(token, stop_ids) if forced is None else forced_lengths[in_cache] <= n + 1
            finished[in_cache] |= stop
            steps = n + 1
            if n == max_new - 1 or bool(finished.all()):
                break
            done = finished[in_cache]
            if drop and int(done.sum()) >= sampling.drop_finished_at * len(in_cache):
                keep = (~done).nonzero().squeeze(-1)
                cache_bytes = max(cache_bytes, cache.nbytes())
                try:
                    cache.select_rows(keep)
                    in_cache = in_cache[keep]
                    if graphs:
                        mark_static(cache)
                except NotImplementedError:  # an injected cache that keeps its rows: decode them all to the end
                    drop = False
            step_positions = (prompt_lengths[in_cache] + n)[:, None]
            step_valid = torch.ones_like(step_positions, dtype=torch.bool)
            if static:
                mask = cache.begin(step_positions, step_valid, static=True)
                logits = step_logits(model, tokens[in_cache, n : n + 1], step_positions, mask, cache)
                logits = logits.clone() if graphs else logits  # a CUDA graph's output is freed by its next replay
                cache.end()
            else:
                logits = self._forward(cache, tokens[in_cache, n : n + 1], step_positions, step_valid)
            cache.after_step(n + 1)
        seconds = time.perf_counter() - t0
        cache_bytes = max(cache_bytes, cache.nbytes())

        completion_mask = torch.arange(steps, device=device)[None, :] < lengths[:, None]
        sequences = torch.cat([ids, tokens[:, :steps]], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask.long()], dim=1)
        record, kept = cache.finish(prompt_lengths, lengths, P + steps)
        memory = cache.memory_share(prompt_lengths, lengths, kept)
        new_tokens = int(lengths.sum())
        stats = {
            "method": cfg.method,
            "batch": N,
            "new_tokens": new_tokens,
            "steps": steps,
            "seconds": seconds,
            "prefill_seconds": t_prefill,
            "decode_seconds": seconds - t_prefill,
            "compress_seconds": cache.seconds,
            "compressions": cache.compressions,
            "tokens_per_s": new_tokens / seconds if seconds > 0 else float("nan"),
            "kv_cache_bytes": cache_bytes,
            "record_bytes_per_sample": 0 if record is None else record.nbytes(),
        }
        return RolloutOutput(sequences, attention_mask, prompt_lengths, lengths, logprobs[:, :steps], record, kept, memory, stats)

    def _forward(self, cache, ids, positions, valid) -> torch.Tensor:
        """Run the model over new tokens ids [N, Q] at logical positions [N, Q]; returns last logits [N, V]."""
        mask = cache.begin(positions, valid)
        out = self.model(
            input_ids=ids, position_ids=positions, attention_mask=mask, kv_context=cache, use_cache=False, logits_to_keep=1
        )
        cache.end()
        return out.logits[:, -1]
