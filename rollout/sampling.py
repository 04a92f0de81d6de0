"""Token sampling with the log-probs the trainer will recompute."""

from __future__ import annotations

import torch


def sample_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    banned: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row.

    logits [B, V]; banned int64 [n] token ids never sampled (their probability still counts in the log-probs).
    Returns (tokens int64 [B], logprobs float32 [B]) where the log-prob is that of softmax(logits / temperature)
    (temperature 0: greedy, log-prob of softmax(logits)) without the top-p cut, the distribution a trainer
    recomputes from the same logits.
    """
    logits = logits.float()
    scaled = logits / temperature if temperature > 0 else logits
    logprobs = scaled.log_softmax(-1)
    pick = scaled if banned is None else scaled.index_fill(-1, banned, float("-inf"))
    if temperature == 0:
        tokens = pick.argmax(-1)
    else:
        probs = pick.softmax(-1)
        if top_p < 1.0:
            sorted_probs, order = probs.sort(-1, descending=True)
            outside = sorted_probs.cumsum(-1) - sorted_probs > top_p  # always keeps the most likely token
            probs = probs.scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1)
