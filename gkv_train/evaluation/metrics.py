"""What an evaluation measures: unbiased pass@k, where the retained tokens sit in each sequence, and the KL of a
model under a compressed cache from a full-cache teacher (its intervals: ``gkv_train.stats``)."""

from __future__ import annotations

import math

import torch

from gkv_rollout.config import CompressionConfig
from gkv_rollout.engine import RolloutEngine
from gkv_train.logprobs import divergence_under_record

DENSITY_BINS = 50


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct among ``n`` samples (Chen et al., 2021):
    1 - C(n - c, k) / C(n, k)."""
    if not 0 < k <= n:
        raise ValueError(f"pass@k needs 0 < k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def kept_at_end(record, prompt_lengths: torch.Tensor, completion_lengths: torch.Tensor, b: int) -> torch.Tensor:
    """bool [parts, T_b - 1]: which of sequence b's tokens its last decoding query (at position T_b - 2: the
    final token is sampled, never fed) attended to, per (layer, KV head) or layer (``Record.kept_at``);
    everything for the full cache (None)."""
    position = max(int(prompt_lengths[b] + completion_lengths[b]) - 2, 0)
    if record is None:
        return torch.ones(1, position + 1, dtype=torch.bool)
    return record.kept_at(b, position)


def position_overlap(length: int, bins: int = DENSITY_BINS) -> torch.Tensor:
    """float64 [length, bins]: the share of bin j's span [j/bins, (j+1)/bins) covered by token k's span
    [k/length, (k+1)/length), times ``bins`` (so each bin's column sums to 1 when every token is present; no
    binning artefacts whether or not ``length`` is a multiple of ``bins``)."""
    k = torch.arange(length, dtype=torch.float64)[:, None]
    j = torch.arange(bins, dtype=torch.float64)[None, :]
    low = torch.maximum(k / length, j / bins)
    high = torch.minimum((k + 1) / length, (j + 1) / bins)
    return (high - low).clamp_min(0) * bins


def retained_by_position(
    record, prompt_lengths, completion_lengths, bins: int = DENSITY_BINS
) -> tuple[list[float], list[float]]:
    """Where the tokens still attended to at each sequence's end (``kept_at_end``) sit, over the normalised
    position k / T in ``bins`` bins, summed over the batch: (kept, present), each [bins]. ``kept`` counts a token
    by the share of (layer, KV head) parts that keep it; ``present`` counts every token. kept / present is the
    absolute retention at that relative position (1 for the full cache); kept / sum(kept) * bins is the density
    of retained positions (the G-KV paper's Figure 7)."""
    kept = torch.zeros(bins, dtype=torch.float64)
    present = torch.zeros(bins, dtype=torch.float64)
    for b in range(prompt_lengths.shape[0]):
        share = kept_at_end(record, prompt_lengths, completion_lengths, b).double().mean(0)  # [T_b - 1]
        overlap = position_overlap(share.shape[0], bins)
        kept += share @ overlap
        present += overlap.sum(0)
    return kept.tolist(), present.tolist()


def compressed_kl(
    teacher,
    model,
    tokenizer,
    traces: list[dict],
    compression: CompressionConfig,
    batch: int = 8,
    chunk_tokens: int = 512,
) -> dict:
    """Mean per-token KL(teacher with the full cache || ``model`` under ``compression``) over the completion
    tokens of ``traces`` (rows with ``prompt`` and ``completion_ids``, e.g. teacher traces of held-out problems).
    Each trace is replayed through the model's compressed cache (``RolloutEngine.replay``: compressions at the
    points a rollout of those tokens would have), and the model attends under the replay's record; distributions
    at temperature 1.

    Returns {"kl": mean over tokens, "tokens": count, "traces": count}.
    """
    engine = RolloutEngine(model, tokenizer, compression)
    total, tokens = 0.0, 0
    for start in range(0, len(traces), batch):
        rows = traces[start : start + batch]
        out = engine.replay([r["prompt"] for r in rows], [r["completion_ids"] for r in rows])
        with torch.no_grad():
            total += divergence_under_record(model, teacher, out, "forward_kl", 1.0, chunk_tokens)[0].item()
        tokens += int(out.completion_mask.sum())
    return {"kl": total / max(tokens, 1), "tokens": tokens, "traces": len(traces)}
