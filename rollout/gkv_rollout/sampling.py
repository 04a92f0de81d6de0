"""Token sampling with the log-probs the trainer will recompute, and the rollout's ``TokenPicker``: each step's
tokens sampled, given (prefixes) or replayed."""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from gkv_rollout.config import SamplingConfig

_NUCLEUS_PROBE = 256  # candidates tried before falling back to a full sort


def rollout_seed(seed: int, step: int, process: int) -> int:
    """The sampling seed of a training rollout: distinct per run seed, optimizer step and process."""
    return seed * 100_003 + step * 1_009 + process


def inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Sample one index per row of non-negative weights probs [B, V] (need not sum to 1) with the uniform draws
    uniform float [B] in [0, 1); returns int64 [B].

    A cumulative sum and a binary search: much cheaper on CPU than ``torch.multinomial`` over a large vocabulary.
    """
    cdf = probs.cumsum(-1)
    u = uniform[:, None].to(cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_max(probs.shape[-1] - 1)


def nucleus(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-p nucleus of each row of probs [B, V], as (weights [B, k], token ids [B, k]) sorted by probability.

    A token is kept when the mass of the tokens ranked before it is at most ``top_p`` (so the most likely token
    always is). Exact: eager, the top ``_NUCLEUS_PROBE`` candidates are used when their mass exceeds ``top_p`` in
    every row (everything after them would be cut anyway), else the whole row is sorted; under ``torch.compile``
    (``compile_decode``, one graph) the whole row is always sorted, since the probe's test is a data-dependent
    branch.
    """
    if torch.compiler.is_compiling():
        weights, ids = probs.sort(-1, descending=True)
    else:
        k = min(_NUCLEUS_PROBE, probs.shape[-1])
        weights, ids = probs.topk(k, dim=-1)
        if k < probs.shape[-1] and not bool((weights.sum(-1) > top_p).all()):
            weights, ids = probs.sort(-1, descending=True)
    outside = weights.cumsum(-1) - weights > top_p
    return weights.masked_fill(outside, 0.0), ids


def scale_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature in fp32 (temperature 0, greedy, leaves them unscaled)."""
    logits = logits.float()
    return logits / temperature if temperature > 0 else logits


def token_logprobs_of(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-prob of given tokens int64 [B] under softmax(logits [B, V] / temperature): float32 [B]."""
    return scale_logits(logits, temperature).log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1)


def head_logprobs(hidden: torch.Tensor, head, targets: torch.Tensor, temperature: float, chunk_rows: int):
    """log p(target) float32 [M] of final hidden states hidden [M, d] through the LM head ``head`` (logits [M, V])
    for targets int64 [M], under softmax(logits / temperature) (``token_logprobs_of``): the given tokens of a
    rollout and the trainer's log-probs. The head runs over ``chunk_rows`` rows at a time, so the [M, V] logits
    are never held at once (a chunk holds about 4 x chunk_rows x V floats at its peak: the logits, their fp32
    copy scaled by the temperature and its log-softmax); with gradients flowing, each chunk is recomputed in the
    backward pass."""
    out = []
    for start in range(0, hidden.shape[0], chunk_rows):
        args = (hidden[start : start + chunk_rows], head, targets[start : start + chunk_rows], temperature)
        if torch.is_grad_enabled() and hidden.requires_grad:
            out.append(checkpoint(_head_chunk_logprobs, *args, use_reentrant=False))
        else:
            out.append(_head_chunk_logprobs(*args))
    return torch.cat(out)


def _head_chunk_logprobs(hidden: torch.Tensor, head, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    return token_logprobs_of(head(hidden), targets, temperature)


def sample_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    uniform: torch.Tensor | None,
    banned: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row.

    logits [B, V]; uniform float [B] in [0, 1): each row's random draw (unused, may be None, when greedy); banned
    int64 [n] token ids never sampled (their probability still counts in the log-probs).
    Returns (tokens int64 [B], logprobs float32 [B]) where the log-prob is that of softmax(logits / temperature)
    (temperature 0: greedy, log-prob of softmax(logits)) without the top-p cut, the distribution a trainer
    recomputes from the same logits.
    """
    scaled = scale_logits(logits, temperature)
    logprobs = scaled.log_softmax(-1)
    pick = scaled if banned is None else scaled.index_fill(-1, banned, float("-inf"))
    if temperature == 0:
        tokens = pick.argmax(-1)
    else:
        probs = pick.softmax(-1)
        if top_p < 1.0:
            weights, ids = nucleus(probs, top_p)
            tokens = ids.gather(-1, inverse_cdf(weights, uniform)[:, None]).squeeze(-1)
        else:
            tokens = inverse_cdf(probs, uniform)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)


@functools.cache
def compiled(fn: Callable, device_type: str) -> Callable:
    """``fn`` under ``torch.compile`` with ``fullgraph=True``, one per function and device type (graphs are
    reused across rollouts): CUDA graphs on a GPU (``reduce-overhead``), Inductor's default elsewhere. Shapes
    start static; a dimension that changes (batch width as finished rows leave, attention width) is made dynamic
    at the next compile."""
    return torch.compile(fn, fullgraph=True, mode="reduce-overhead" if device_type == "cuda" else None)


class TokenPicker:
    """Each step's tokens from the logits: sampled (top-p at the temperature; stop tokens banned with
    ``ignore_eos``), or with ``forced`` completions the given tokens and their log-probs (``replay``), or with
    ``prefixes`` the given tokens while a row's prefix lasts and sampled ones after it.

    given_width: the longest row of given tokens (0: none); given_count: the given tokens of all rows (0: none);
    given_ends: (with ``sampling.chunk_given``) int64 [batch] on the CPU, each row's count of leading tokens that
    are given and end nothing (a prefix's length, a replayed completion's less its last token), which a forward of
    several tokens may take (``given_span``); given_last: their largest (past it, every forward takes one token)."""

    def __init__(
        self, sampling: SamplingConfig, forced, batch: int, pad_id: int, stop_ids: list[int], device, prefixes=None
    ):
        static = sampling.compile_decode
        self.sampling, self.batch = sampling, batch
        self.sample = compiled(sample_tokens, device.type) if static else sample_tokens
        self.logprob_of = compiled(token_logprobs_of, device.type) if static else token_logprobs_of
        self.stop_ids = torch.tensor(stop_ids, dtype=torch.long, device=device)
        self.banned = self.stop_ids if sampling.ignore_eos and len(stop_ids) else None
        self.generator = torch.Generator(device=device).manual_seed(sampling.seed)
        self.forced = self.forced_lengths = self.given_ends = None
        self.given_width = self.given_count = self.given_last = 0
        self.then_sample = prefixes is not None  # the given tokens are beginnings: sampling follows them
        given = prefixes if prefixes is not None else forced
        if given is not None:
            lengths = [len(c) for c in given]
            self.forced_lengths = torch.tensor(lengths, device=device)
            width = sampling.max_new_tokens
            self.forced = torch.tensor([list(c) + [pad_id] * (width - len(c)) for c in given], device=device)
            self.given_width, self.given_count = max(lengths), sum(lengths)
            if sampling.chunk_given:
                self.given_ends = torch.tensor(lengths) - (0 if self.then_sample else 1)
                self.given_last = int(self.given_ends.max())

    def __call__(self, logits: torch.Tensor, n: int, rows: torch.Tensor):
        """logits [n_rows, V] of ``rows`` (indices into the batch) at step n -> (token int64 [n_rows], logprob
        float32 [n_rows], stop bool [n_rows]: the token ends its row)."""
        s = self.sampling
        if self.forced is not None and not self.then_sample:
            token = self.forced[rows, n]
            return token, self.logprob_of(logits, token, s.temperature), self.forced_lengths[rows] <= n + 1
        token, logprob, stop = self.sampled(logits, rows)
        if self.forced is not None:  # prefixes: the given token while a row's prefix lasts
            given = n < self.forced_lengths[rows]
            if bool(given.any()):
                forced = self.forced[rows, n]
                token = torch.where(given, forced, token)
                logprob = torch.where(given, self.logprob_of(logits, forced, s.temperature), logprob)
                stop = stop & ~given
        return token, logprob, stop

    def given_tokens(self, rows: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """The given tokens int64 [n_rows, stop - start] of ``rows`` at steps start .. stop - 1 (padding past a
        row's given tokens)."""
        return self.forced[rows, start:stop]

    def skip(self, steps: int) -> None:
        """Steps whose tokens were given without calling this picker: their random draws (one for the batch each
        step, as ``sampled`` draws whether a row's token is given or not) are drawn and left unused."""
        if self.then_sample and self.sampling.temperature != 0:
            for _ in range(steps):
                torch.rand(self.batch, generator=self.generator, device=self.generator.device)

    def sampled(self, logits: torch.Tensor, rows: torch.Tensor):
        """The sampled (token, logprob, stop) of ``__call__``."""
        s = self.sampling
        uniform = None
        if s.temperature != 0:  # one draw per batch row every step, whichever rows remain: sampling is reproducible
            uniform = torch.rand(self.batch, generator=self.generator, device=logits.device)[rows]
        token, logprob = self.sample(logits, s.temperature, s.top_p, uniform, self.banned)
        return token, logprob, torch.isin(token, self.stop_ids)
