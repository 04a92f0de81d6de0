"""Token sampling with the log-probs the trainer will recompute."""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

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
