import pytest
import torch
from conftest import random_prompts

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.contract.eviction import NEVER, record_to_columns, visibility_mask, visible_counts
from gkv_rollout.contract.record import logical_positions
from gkv_rollout.engine import RolloutEngine


def test_logical_positions_ignore_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    assert logical_positions(mask).tolist() == [[0, 0, 0, 1, 2, 0], [0, 1, 2, 3, 4, 5]]


def test_visibility_mask_matches_definition():
    torch.manual_seed(0)
    B, H, T = 2, 2, 9
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[0, :3] = 0
    evict_at = torch.randint(0, 12, (B, 1, H, T), dtype=torch.int32)
    pos = logical_positions(attention_mask)
    cols = record_to_columns(evict_at, pos)
    mask = visibility_mask(cols[:, 0], pos, attention_mask.bool(), pos)
    for b in range(B):
        for h in range(H):
            for q in range(T):
                for k in range(T):
                    if not attention_mask[b, q]:
                        continue
                    expected = bool(attention_mask[b, k]) and pos[b, k] <= pos[b, q] < evict_at[b, 0, h, pos[b, k]]
                    assert bool(mask[b, h, q, k]) == expected


def test_evicts_nothing_exactly_when_every_real_query_sees_causally():
    """``EvictionMasks.evicts_nothing``: true iff every real query sees exactly the real keys up to its position
    (its mask equals the causal one), whatever the padding; a stamp at a row's last position is an eviction that
    query sees, one after it is none, and a stamp on a padding column (or past the row's end) counts for nothing."""
    from gkv_rollout.contract.eviction import EvictionMasks

    attention_mask = torch.ones(2, 7, dtype=torch.long)
    attention_mask[0, :2] = 0  # row 0: 5 tokens, left-padded
    attention_mask[1, 6] = 0  # row 1: 6 tokens, ended
    pos, valid = logical_positions(attention_mask), attention_mask.bool()
    real_queries = valid[:, None, :, None].expand(-1, 2, -1, 7)  # [B, Hkv, Q, K]
    causal = visibility_mask(torch.full((2, 2, 7), NEVER, dtype=torch.int32), pos, valid, pos)[real_queries]

    def evicts_nothing(row, key, stamp):
        evict_at = torch.full((2, 3, 2, 7), NEVER, dtype=torch.int32)
        evict_at[row, 1, 1, key] = stamp
        masks = EvictionMasks.build(evict_at, attention_mask)
        assert masks.evicts_nothing() == torch.equal(masks.layer_mask(1, 7)[real_queries], causal)
        return masks.evicts_nothing()

    assert evicts_nothing(0, 4, NEVER) and evicts_nothing(0, 2, 5) and evicts_nothing(1, 0, 6)
    assert not evicts_nothing(0, 2, 4) and not evicts_nothing(1, 0, 5) and not evicts_nothing(1, 3, 4)
    assert evicts_nothing(0, 6, 3)  # logical position 6: past row 0's end, no column holds it


METHODS = [
    CompressionConfig("streaming", budget=20, window=4, interval=6),
    CompressionConfig("snapkv", budget=20, window=4, interval=6),
    CompressionConfig("h2o", budget=20, window=4, interval=6, sinks=2),
    CompressionConfig("rkv", budget=20, window=4, interval=6),
    CompressionConfig.of("gkv", budget=20, window=4, interval=6, form="mean"),
]


@pytest.mark.parametrize("cfg", METHODS, ids=lambda c: c.method)
def test_every_compression_keeps_budget_window_and_sinks(tiny_llama, cfg):
    prompts = random_prompts([7, 25, 13, 31])
    out = RolloutEngine(tiny_llama, compression=cfg).generate(
        prompts, SamplingConfig(max_new_tokens=30, seed=2, ignore_eos=True)
    )
    rec = out.record.evict_at
    N, L, H, T = rec.shape
    assert rec.dtype == torch.int32 and (N, L) == (4, tiny_llama.config.num_hidden_layers)
    assert H == tiny_llama.config.num_key_value_heads and T == out.sequences.shape[1]
    P = max(len(p) for p in prompts)
    assert out.stats["compressions"] == 1 + 30 // cfg.interval - (30 % cfg.interval == 0)  # prefill + every interval
    for b in range(N):
        p_len = int(out.prompt_lengths[b])
        length = p_len + int(out.completion_lengths[b])
        stamps = [p_len] if P > cfg.budget else []
        stamps += [p_len + n for n in range(cfg.interval, 30, cfg.interval)]
        found = set(rec[b][rec[b] != NEVER].unique().tolist())
        assert found <= set(stamps)
        for s in stamps:
            kept = visible_counts(rec[b : b + 1], torch.tensor([s]))[0] - 1  # minus the query itself
            assert (kept == min(cfg.budget, s)).all(), (s, kept)
            window = rec[b, :, :, s - cfg.resolved.window : s]
            assert (window > s).all()
        assert (rec[b, :, :, : cfg.resolved.sinks] == NEVER).all()
        for q in range(p_len, length):
            assert (visible_counts(rec[b : b + 1], torch.tensor([q])) <= cfg.budget + cfg.interval).all()
    assert ((out.retention > 0) & (out.retention < 1)).all()


def test_heads_and_layers_evict_differently(tiny_llama):
    cfg = CompressionConfig("gkv", budget=20, window=4, interval=6)
    out = RolloutEngine(tiny_llama, compression=cfg).generate(
        random_prompts([40, 33]), SamplingConfig(max_new_tokens=20)
    )
    rec = out.record.evict_at
    assert not torch.equal(rec[:, 0], rec[:, 1]) and not torch.equal(rec[:, :, 0], rec[:, :, 1])


def test_row_selection_keeps_the_batch_dimension():
    import numpy as np

    from gkv_rollout.contract import record_from_batch
    from gkv_rollout.contract.eviction import EvictionRecord

    record = EvictionRecord(torch.arange(24, dtype=torch.int32).view(3, 2, 2, 2))
    for rows, first in ((-1, 16), (1, 8), (np.int64(2), 16), (torch.tensor(0), 0)):
        assert record[rows].evict_at.shape == (1, 2, 2, 2) and record[rows].evict_at.flatten()[0] == first
    assert record[1:].evict_at.shape[0] == 2
    assert torch.equal(record_from_batch(record.to_batch()).evict_at, record.evict_at)
    assert record_from_batch({"prompt_ids": torch.zeros(1)}) is None
