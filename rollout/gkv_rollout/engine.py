"""Batched sampling with a compressed KV cache, returning what the trainer needs to reproduce it.

The engine drives an HF causal LM (any model whose attention goes through ``AttentionInterface``: Llama,
Qwen2, Qwen3, ...) token by token with its own cache as attention context (``EvictionCache`` for the G-KV
family, ``S4RCache`` for S4R; any ``gkv_rollout.kv_cache.KVCache`` can be injected); given tokens (prefixes,
replayed completions) go through several at a time, up to the cache's next compression point. Prompts are
left-padded; every sequence keeps its own logical positions, length and end-of-sequence state.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import torch

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.contract.attention import decoder_and_head, use_kv_attention
from gkv_rollout.contract.record import Record, logical_positions
from gkv_rollout.kv_cache import KVCache
from gkv_rollout.sampling import TokenPicker, compiled, head_logprobs

Prompt = str | Sequence[int] | Sequence[dict]
# logits a forward of given tokens computes at once: 64 MiB in fp32, about 4x that at the peak (the logits, their
# fp32 copy divided by the temperature, and its log-softmax: ``head_logprobs``)
HEAD_ELEMENTS = 2**24


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
    """The cache of ``compression``'s method (``Method.make_cache``); ``seed``: the rollout's sampling seed (the
    ``random`` method draws from it)."""
    return compression.resolved.make_cache(model, batch, prompt_width, max_new, device, seed)


def forward_logits(model, ids, positions, mask, cache) -> torch.Tensor:
    """The model's last logits [N, V] for new tokens ids [N, Q] at logical positions [N, Q], attending under
    ``mask`` (the cache's, from ``begin``) with ``cache`` as the attention context: prefill's and a decode step's
    model call (``given_forward`` runs given tokens)."""
    out = model(
        input_ids=ids, position_ids=positions, attention_mask=mask, kv_context=cache, use_cache=False, logits_to_keep=1
    )
    return out.logits[:, -1]


def decode_one_token(model, ids, positions, mask, cache) -> torch.Tensor:
    """One decode step: ids [N, 1] at positions [N, 1] -> the next logits [N, V]. The unit ``compile_decode``
    compiles (``fullgraph=True``: a graph break is an error, never a silently slower step); the cache's
    static-shape ``begin``/``end`` run around it, outside the graph."""
    return forward_logits(model, ids, positions, mask, cache)


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

        Returns the record of these tokens and their log-probs under softmax(logits / sampling.temperature): the
        cache compresses at the points a sampled rollout of them does, over the same tokens. With
        ``sampling.chunk_given`` (the default) the tokens go through up to each compression point in one forward,
        whose rounding may cross a top-k boundary that one token per forward does not (``SamplingConfig``): the
        record is this replay's own, and the trainer reproduces it. ``chunk_given=False`` feeds one token per
        forward, as sampling does: the record and log-probs of a rollout sampled without prefixes, bit for bit.
        ``sampling.max_new_tokens`` is the rollout's (at least the longest completion; without ``sampling``: the
        longest completion): S4R solves its rank at prompt + ``max_new_tokens`` unless ``expected_length`` is set.
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
        prefixes: Sequence[Sequence[int]] | None = None,
    ) -> RolloutOutput:
        """Sample completions (or, with ``forced``, feed the given ones: see ``replay``). The model runs in
        eval mode (no dropout) without gradients; its training mode is restored on return. ``progress``, when
        given, is called after every step with the number of tokens generated since its last call (e.g. a
        progress bar's ``update``).

        ``prefixes``: the first tokens of each prompt's completions (one per prompt, shorter than
        ``max_new_tokens``), fed as if sampled: the cache compresses as it would while writing them, their
        log-probs are the model's, and sampling goes on after them (a stop token inside a prefix does not end its
        row). The completions and the record hold them. While every unfinished row has given tokens left, they go
        through the model up to the next compression point in one forward (``SamplingConfig.chunk_given``,
        ``given_span``). Any iterables of token ids will do (a generator of them too); they are read once."""
        if prefixes is not None:
            prefixes = given_rows(prefixes, "prefixes")
            if forced is not None:
                raise ValueError("give forced (whole completions) or prefixes (their beginnings), not both")
            if len(prefixes) != len(prompts):
                raise ValueError(f"{len(prefixes)} prefixes for {len(prompts)} prompts")
            check_token_ids(prefixes, self.model.get_input_embeddings().num_embeddings, "prefixes")
            longest = max((len(p) for p in prefixes), default=0)
            limit = (sampling or SamplingConfig()).max_new_tokens
            if longest >= limit:
                raise ValueError(f"a prefix of {longest} tokens leaves nothing to sample within {limit} max_new_tokens")
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                return self._generate(prompts, sampling or SamplingConfig(), forced, progress, prefixes)
        finally:
            self.model.train(was_training)

    def _generate(self, prompts, sampling: SamplingConfig, forced, progress, prefixes=None) -> RolloutOutput:
        """prefill, then step by step: pick each row's token, drop finished rows from the cache, stop when every row
        has; feed the step's tokens (``decode_one_token``), or with them the given tokens that follow, as far as
        ``given_span`` allows (``feed_given``); the record and statistics from what the cache saw."""
        model, device = self.model, next(self.model.parameters()).device
        rows = [r for r in encode_prompts(self.tokenizer, prompts, self.chat) for _ in range(sampling.num_samples)]
        pad_id = self.pad_id()
        ids, prompt_mask = left_pad(rows, pad_id, device)
        N, P = ids.shape
        max_new = sampling.max_new_tokens
        if forced is None:  # (a replay's length is its completions', whatever they are)
            self.compression.check_generation(max_new, "max_new_tokens")
        cache = self.cache_factory(model, self.compression, N, P, max_new, device, sampling.seed)
        step = DecodeStep(model, cache, sampling.compile_decode, self.compression.method)
        stop_ids = stop_ids_of(model, self.tokenizer, sampling)
        if prefixes is not None:  # one per prompt, given to each of its samples
            prefixes = [list(p) for p in prefixes for _ in range(sampling.num_samples)]
        pick = TokenPicker(sampling, forced, N, pad_id, stop_ids, device, prefixes)
        state = Decoding(N, max_new, pad_id, prompt_mask.sum(-1), device, pick.given_count)

        t0 = time.perf_counter()
        logits = prefill(model, cache, ids, logical_positions(prompt_mask), prompt_mask.bool())
        t_prefill = time.perf_counter() - t0
        t_given = None if pick.given_width else 0.0  # until the last given token has been through the model
        drop = sampling.drop_finished_at < 1.0
        n = 0  # the step: the index of the token picked next
        while True:
            token, logprob, stop = pick(logits, n, state.in_cache)
            live = state.append(n, token, logprob, stop)
            if progress is not None:
                progress(live)
            if n == max_new - 1 or bool(state.finished.all()):
                break
            if drop:
                drop = state.drop_finished(cache, sampling.drop_finished_at, step)
            span = given_span(pick, state, cache, n)
            if span == 1:
                logits = step(state.last_tokens(n), state.next_positions(n))
            else:
                logits = feed_given(model, cache, pick, state, n, span, progress)
            n += span
            state.forwards += 1
            cache.after_step(n)
            if t_given is None and n >= pick.given_width:
                t_given = time.perf_counter() - t0 - t_prefill
        seconds = time.perf_counter() - t0
        state.cache_bytes = max(state.cache_bytes, cache.nbytes())
        t_given = seconds - t_prefill if t_given is None else t_given  # replay: its last tokens are never fed
        return finish(cache, ids, prompt_mask, state, self.compression.method, seconds, t_prefill, t_given)


def prefill(model, cache: KVCache, ids, positions, valid) -> torch.Tensor:
    """The prompts ids [N, P] at logical positions [N, P] (valid bool [N, P]: not padding) into the cache;
    returns the first logits [N, V]."""
    mask = cache.begin(positions, valid)
    logits = forward_logits(model, ids, positions, mask, cache)
    cache.end()
    cache.after_prefill()
    return logits


class DecodeStep:
    """``decode_one_token`` around the cache's ``begin``/``end``: eager, or (``compile``) its compiled static-shape
    form, whose buffers on CUDA keep their address for CUDA graphs (``mark_static`` again after rows leave)."""

    def __init__(self, model, cache: KVCache, compile: bool, method: str):
        if compile and not getattr(cache, "static_decode", False):
            raise ValueError(
                f"compile_decode: the {type(cache).__name__} of method {method!r} has no static decode step "
                "(the full cache and the G-KV family have one)"
            )
        device = next(model.parameters()).device
        self.model, self.cache, self.static = model, cache, compile
        self.graphs = compile and device.type == "cuda"
        self.fn = compiled(decode_one_token, device.type) if compile else decode_one_token
        self.cache_moved()

    def cache_moved(self) -> None:
        """The cache's step buffers were reallocated (rows left): CUDA graphs need their new addresses."""
        if self.graphs:
            mark_static(self.cache)

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """ids, positions int64 [n, 1] for the rows the cache holds -> logits [n, V]."""
        valid = torch.ones_like(positions, dtype=torch.bool)
        mask = self.cache.begin(positions, valid, static=True) if self.static else self.cache.begin(positions, valid)
        logits = self.fn(self.model, ids, positions, mask, self.cache)
        if self.graphs:
            logits = logits.clone()  # a CUDA graph's output is freed by its next replay
        self.cache.end()
        return logits


def given_span(pick: TokenPicker, state: Decoding, cache: KVCache, n: int) -> int:
    """How many tokens per row the forward after step n takes: 1 (step n's token), or with it the given tokens
    that follow, as many as every unfinished row in the cache has (given and ending nothing: a prefix's tokens, a
    replayed completion's but its last) and at most up to the next compression point (``cache.forward_span``).

    Compression is batch-synchronous (every ``interval`` generated tokens, for every row), so every row advances
    the same number of tokens per forward: a forward of several tokens needs all unfinished rows to be inside
    their given tokens. While some row samples (its prefix ended, or it had none), every forward takes one token,
    the rows still inside a prefix included. Finished rows left in the cache are fed padding, as in a decode
    step (their given tokens are behind them)."""
    if pick.given_ends is None or n + 1 >= pick.given_last:
        return 1
    limit = cache.forward_span(n)
    if limit <= 1:
        return 1
    ends = pick.given_ends[state.live_rows().cpu()]
    return max(1, min(limit, int(ends.min()) - n))


def feed_given(model, cache: KVCache, pick: TokenPicker, state: Decoding, n: int, span: int, progress) -> torch.Tensor:
    """Steps n + 1 .. n + span - 1, whose tokens are given, at once: step n's tokens and the given ones after
    them through one forward (``given_forward``), appended with their log-probs (the random draws of the steps
    skipped, so that sampling after them draws as one step at a time does); returns the logits [n_rows, V] that
    follow them."""
    given = pick.given_tokens(state.in_cache, n + 1, n + span)  # [n_rows, span - 1]
    ids = torch.cat([state.last_tokens(n), given], dim=1)
    positions = state.next_positions(n) + torch.arange(span, device=ids.device)
    logprobs, logits = given_forward(model, cache, ids, positions, pick.sampling.temperature)
    pick.skip(span - 1)
    live = state.append_given(n + 1, given, logprobs)
    if progress is not None:
        progress(live * (span - 1))
    return logits


def given_forward(model, cache: KVCache, ids, positions, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens ids int64 [N, Q] at logical positions [N, Q] through one forward into the cache, causal among them
    over what it holds -> (log-probs float32 [N, Q - 1] of ids[:, 1:], each under softmax(logits / temperature)
    at the position before it; the logits [N, V] after the last). The LM head runs over at most
    ``HEAD_ELEMENTS`` logits at a time (``head_logprobs``): the [N, Q, V] logits are never held at once. The
    logits are the bare LM head's, as the one-token step's are: ``use_kv_attention`` refuses a model whose causal
    LM changes them after the head."""
    decoder, head = decoder_and_head(model)
    mask = cache.begin(positions, torch.ones_like(positions, dtype=torch.bool))
    hidden = decoder(
        input_ids=ids, position_ids=positions, attention_mask=mask, kv_context=cache, use_cache=False
    ).last_hidden_state
    cache.end()
    N, Q, d = hidden.shape
    last = head(hidden[:, -1])  # [N, V]
    before = hidden[:, :-1].reshape(N * (Q - 1), d)  # the states before ids[:, 1:]
    rows = max(1, HEAD_ELEMENTS // last.shape[-1])
    logprobs = head_logprobs(before, head, ids[:, 1:].reshape(-1), temperature, rows)
    return logprobs.view(N, Q - 1), last


def given_rows(rows, name: str) -> list:
    """``rows`` (the argument ``name``: any iterable of rows of token ids, a generator too) as a list of lists, each
    read once; a text, or a row that is not iterable, stays as it is for ``check_token_ids`` to name. ValueError
    when ``rows`` is no iterable of rows."""
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Iterable):
        raise ValueError(f"{name} is {type(rows).__name__}: one list of token ids per prompt")
    return [row if isinstance(row, (str, bytes)) or not isinstance(row, Iterable) else list(row) for row in rows]


def check_token_ids(rows, vocab: int, name: str) -> None:
    """Each row of ``rows`` (the argument ``name``) a sequence of token ids: integers in [0, ``vocab``); ValueError
    naming the argument, the row and what is wrong (a string, a float, None, an id outside the vocabulary)."""
    for i, row in enumerate(rows):
        if isinstance(row, (str, bytes)) or not hasattr(row, "__len__"):
            raise ValueError(f"{name}[{i}] is {type(row).__name__}: a list of token ids (tokenize the text first)")
        for token in row:
            if (
                isinstance(token, bool)
                or not isinstance(token, (int, torch.Tensor))
                or (isinstance(token, torch.Tensor) and (token.numel() != 1 or token.is_floating_point()))
            ):
                raise ValueError(f"{name}[{i}] holds {token!r}: token ids are integers")
            if not 0 <= int(token) < vocab:
                raise ValueError(f"{name}[{i}] holds the id {int(token)}, outside the vocabulary (0-{vocab - 1})")


class Decoding:
    """What the decode loop has produced so far, by batch row: tokens int64 [N, max_new] (pad past the end),
    logprobs float32 [N, max_new] (0 past the end), lengths int64 [N], finished bool [N]; ``in_cache`` int64: the
    rows the cache still holds, in its order; ``cache_bytes``: the most the cache held; ``forwards``: the decode
    forwards run (fewer than the steps when given tokens went through several at a time); ``given``: how many of
    the tokens are given (prefixes, a replay's completions), not sampled."""

    def __init__(self, batch: int, max_new: int, pad_id: int, prompt_lengths: torch.Tensor, device, given: int = 0):
        self.pad_id, self.prompt_lengths, self.given = pad_id, prompt_lengths, given
        self.tokens = torch.full((batch, max_new), pad_id, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((batch, max_new), dtype=torch.float32, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.in_cache = torch.arange(batch, device=device)
        self.cache_bytes = 0
        self.steps = self.forwards = 0

    def append(self, n: int, token: torch.Tensor, logprob: torch.Tensor, stop: torch.Tensor) -> int:
        """Step n's token, log-prob and stop flag [n_rows] for the rows in the cache (a finished row's are
        dropped); returns how many rows were live."""
        rows = self.in_cache
        live = ~self.finished[rows]
        self.tokens[rows, n] = torch.where(live, token, self.pad_id)
        self.logprobs[rows, n] = torch.where(live, logprob, 0.0)
        self.lengths[rows] += live.long()
        self.finished[rows] |= stop
        self.steps = n + 1
        return int(live.sum())

    def append_given(self, start: int, tokens: torch.Tensor, logprobs: torch.Tensor) -> int:
        """Given tokens and their log-probs [n_rows, k] as steps start .. start + k - 1 of the rows in the cache
        (none ends its row; a finished row's are dropped); returns how many rows were live."""
        rows, k = self.in_cache, tokens.shape[1]
        live = ~self.finished[rows]
        self.tokens[rows, start : start + k] = torch.where(live[:, None], tokens, self.pad_id)
        self.logprobs[rows, start : start + k] = torch.where(live[:, None], logprobs, 0.0)
        self.lengths[rows] += live.long() * k
        self.steps = start + k
        return int(live.sum())

    def live_rows(self) -> torch.Tensor:
        """int64: the rows the cache holds that have not finished."""
        return self.in_cache[~self.finished[self.in_cache]]

    def drop_finished(self, cache: KVCache, at: float, step: DecodeStep) -> bool:
        """Once a share ``at`` of the rows in the cache has finished, take them out of it. Returns whether
        dropping stays possible (False: an injected cache that keeps its rows decodes them all to the end)."""
        done = self.finished[self.in_cache]
        if int(done.sum()) < at * len(self.in_cache):
            return True
        keep = (~done).nonzero().squeeze(-1)
        self.cache_bytes = max(self.cache_bytes, cache.nbytes())
        try:
            cache.select_rows(keep)
        except NotImplementedError:
            return False
        self.in_cache = self.in_cache[keep]
        step.cache_moved()
        return True

    def last_tokens(self, n: int) -> torch.Tensor:
        """Step n's tokens [n_rows, 1] of the rows in the cache: the next step's input."""
        return self.tokens[self.in_cache, n : n + 1]

    def next_positions(self, n: int) -> torch.Tensor:
        """Their logical positions [n_rows, 1]."""
        return (self.prompt_lengths[self.in_cache] + n)[:, None]


def finish(
    cache: KVCache, ids, prompt_mask, state: Decoding, method: str, seconds: float, t_prefill: float, t_given: float
):
    """The ``RolloutOutput`` of a finished loop: sequences, the record and retention from the cache, statistics
    (``tokens_per_s``: every completion token, given ones included, per second of the rollout;
    ``sampled_tokens_per_s``: the sampled ones only (0 for a replay); ``given_seconds``: from the prefill's end
    until every given token had been through the model: the part of ``decode_seconds`` that prefixes took, all of
    it for a replay, 0 without given tokens)."""
    steps, lengths = state.steps, state.lengths
    P = ids.shape[1]
    completion_mask = torch.arange(steps, device=ids.device)[None, :] < lengths[:, None]
    sequences = torch.cat([ids, state.tokens[:, :steps]], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask.long()], dim=1)
    record, kept = cache.finish(state.prompt_lengths, lengths, P + steps)
    memory = cache.memory_share(state.prompt_lengths, lengths, kept)
    new_tokens = int(lengths.sum())
    stats = {
        "method": method,
        "batch": ids.shape[0],
        "new_tokens": new_tokens,
        "sampled_tokens": new_tokens - state.given,
        "steps": steps,
        "forwards": state.forwards,
        "seconds": seconds,
        "prefill_seconds": t_prefill,
        "decode_seconds": seconds - t_prefill,
        "given_seconds": t_given,
        "compress_seconds": cache.seconds,
        "compress_phase_seconds": dict(cache.phase_seconds),
        "compressions": cache.compressions,
        "tokens_per_s": new_tokens / seconds if seconds > 0 else float("nan"),
        "sampled_tokens_per_s": (new_tokens - state.given) / seconds if seconds > 0 else float("nan"),
        "kv_cache_bytes": state.cache_bytes,
        "record_bytes_per_sample": 0 if record is None else record.nbytes(),
    }
    return RolloutOutput(
        sequences, attention_mask, state.prompt_lengths, lengths, state.logprobs[:, :steps], record, kept, memory, stats
    )
