"""S4R: low-rank cache with sparse reconstruction, in the rollout and in the trainer."""

import dataclasses

import pytest
import torch
from conftest import random_prompts

import gkv_rollout.s4r_cache as s4r_cache
from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.contract.bits import pack_bits, unpack_bits
from gkv_rollout.contract.rope import apply_rope, inverse_rope
from gkv_rollout.engine import RolloutEngine, make_cache
from gkv_rollout.lowrank import (
    chosen_in_order,
    hidden_keys,
    key_bias,
    latent_probs,
    persistent_elements,
    s4r_rank,
    sample_positions,
    select_tokens,
    selection_budget,
)
from gkv_rollout.s4r_cache import PHASES
from gkv_train.training.consistency import consistency_report

TOL = 1e-4
PROMPTS = [40, 63, 52, 71, 45]


def rollout(model, prompts, cfg, new_tokens=64, seed=1):
    sampling = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0, seed=seed, ignore_eos=True)
    return RolloutEngine(model, compression=cfg).generate(prompts, sampling)


@pytest.mark.floor
@pytest.mark.parametrize(
    "cfg",
    [
        CompressionConfig.of("s4r", eta=0.3, window=4),
        CompressionConfig.of("s4r", eta=0.4, window=6, rank=6, rank_v=10, pool="avg", group_agg="max"),
        CompressionConfig.of("s4r", eta=0.3, window=4, normalize=False, sinks=0, full_layers=[0, 3]),
        CompressionConfig.of("s4r", eta=0.4, window=4, refresh=8, refresh_rank=2),
        CompressionConfig.of("s4r", eta=0.3, window=4, basis="prompt", rank_ratio=2.0),
        CompressionConfig.of("s4r", eta=0.3, window=4, exact="keys"),
        CompressionConfig.of("s4r", eta=0.3, window=4, exact="values"),
    ],
    ids=[
        "default",
        "asymmetric-avg-max",
        "no-norm-no-sinks-full-layers",
        "refresh",
        "prompt-basis-value-rank-2x",
        "exact-keys",
        "exact-values",
    ],
)
def test_s4r_consistency_tiny(tiny_llama, cfg):
    out = rollout(tiny_llama, random_prompts(PROMPTS), cfg)
    report = consistency_report(tiny_llama, out)
    assert report["max_abs_logprob_diff"] <= TOL
    assert report["causal_mask_diff"] > 1e-2
    assert report["rotated_layers_diff"] > 1e-2
    assert ((out.retention > 0) & (out.retention < 0.8)).all()
    phases = out.stats["compress_phase_seconds"]  # where S4R's time goes, in parts that sum to its time
    assert list(phases) == list(PHASES) and all(phases[p] > 0 for p in ("fit", "score", "reconstruct", "attend"))
    assert (phases["refresh"] > 0) == bool(cfg.resolved.refresh)
    assert sum(phases.values()) == pytest.approx(out.stats["compress_seconds"])


def test_full_rank_and_rho_one_is_full_attention(tiny_llama):
    dim = tiny_llama.config.num_key_value_heads * tiny_llama.config.head_dim
    out = rollout(tiny_llama, random_prompts(PROMPTS), CompressionConfig.of("s4r", window=4, rank=dim, rho=1.0))
    assert consistency_report(tiny_llama, out)["causal_mask_diff"] <= TOL


def test_replay_reproduces_an_s4r_rollout(tiny_llama):
    cfg = CompressionConfig.of("s4r", eta=0.3, window=4)
    engine = RolloutEngine(tiny_llama, compression=cfg)
    prompts = random_prompts(PROMPTS[:3], seed=2)
    sampled = engine.generate(prompts, SamplingConfig(max_new_tokens=30, seed=5))
    replayed = engine.replay(prompts, sampled.completions())
    for name in ("bases_k", "bases_v", "selected", "prompt_lengths"):
        assert torch.equal(getattr(replayed.record, name), getattr(sampled.record, name))


def test_prompt_basis_fits_every_prompt_token_and_rank_ratio_splits_the_rank(tiny_llama, monkeypatch):
    """basis=prompt: the bases come from every non-sink prompt token, not the paper's sample (no sampling, so the
    sample's recent share changes nothing; it changes the sampled bases). rank_ratio=2: r_k + r_v = 2 r with the
    value rank about twice the key rank, per row, as the record says."""
    prompts = random_prompts(PROMPTS[:3], seed=3)

    def record(**options):
        engine = RolloutEngine(tiny_llama, compression=CompressionConfig.of("s4r", eta=0.3, window=4, **options))
        return engine.generate(prompts, SamplingConfig(max_new_tokens=4, seed=1)).record

    sampled = record().bases_k
    assert not torch.equal(record(recent_ratio=0.2).bases_k, sampled)

    def no_sample(*_):
        raise AssertionError("basis=prompt samples nothing")

    monkeypatch.setattr(s4r_cache, "sample_positions", no_sample)
    whole = record(basis="prompt")
    assert torch.equal(record(basis="prompt", recent_ratio=0.2).bases_k, whole.bases_k)
    assert not torch.equal(whole.bases_k, sampled)
    split = record(basis="prompt", rank_ratio=2.0)
    for b in range(len(prompts)):  # the rank eta gives (r_k = r_v = r by default), split 1:2
        r, k, v = (int(ranks[b].max()) for ranks in (whole.key_rank, split.key_rank, split.value_rank))
        assert k + v == 2 * r and abs(v / k - 2) <= 2 / k
    with pytest.raises(ValueError, match="basis must be one of sampled, prompt"):
        CompressionConfig.of("s4r", basis="whole")
    with pytest.raises(ValueError, match="set the two ranks instead"):
        CompressionConfig.of("s4r", rank=4, rank_ratio=2.0)


def test_exact_control_keeps_the_selection_and_attends_to_exact_states(tiny_llama):
    """exact (a control): the selection is S4R's rule (on the same tokens the first layer, whose inputs are the
    tokens alone, chooses the same bits; later layers see the changed attention outputs), and with both keys and
    values exact the chosen tokens attend with their own states: the record's identity bases at full rank
    reproduce the rollout in training, and the log-probs move away from S4R's."""
    cfg = CompressionConfig.of("s4r", eta=0.3, window=4)
    prompts = random_prompts(PROMPTS[:3], seed=4)
    sampled = RolloutEngine(tiny_llama, compression=cfg).generate(prompts, SamplingConfig(max_new_tokens=24, seed=2))
    control = dataclasses.replace(cfg, options={**cfg.options, "exact": "both"})
    exact = RolloutEngine(tiny_llama, compression=control).replay(prompts, sampled.completions())
    assert torch.equal(exact.record.selected[:, 0], sampled.record.selected[:, 0])
    assert not torch.equal(exact.record.selected, sampled.record.selected)
    dim = tiny_llama.config.num_key_value_heads * tiny_llama.config.head_dim
    assert exact.record.bases_k.shape[-1] == dim and int(exact.record.value_rank.max()) == dim
    assert (exact.logprobs - sampled.logprobs).abs().max() > 1e-3
    report = consistency_report(tiny_llama, exact)
    assert report["max_abs_logprob_diff"] <= TOL and report["causal_mask_diff"] > 1e-2
    # rows leaving at every finish keep their exact states: the same tokens and log-probs as keeping them
    runs = [
        RolloutEngine(tiny_llama, compression=control).generate(
            prompts,
            SamplingConfig(max_new_tokens=24, seed=2, stop_token_ids=tuple(range(10, 24)), drop_finished_at=d),
        )
        for d in (1.0, 0.01)
    ]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert torch.allclose(runs[0].logprobs, runs[1].logprobs, atol=1e-5)
    with pytest.raises(ValueError, match="exact must be one of none, keys, values, both"):
        CompressionConfig.of("s4r", exact="all")


def test_persistent_bytes_follow_the_formula(tiny_llama):
    cfg = CompressionConfig.of("s4r", eta=0.25, window=4, expected_length=0)  # eta at the prompt's length
    caches = []
    engine = RolloutEngine(
        tiny_llama, compression=cfg, cache_factory=lambda *a: caches.append(make_cache(*a)) or caches[-1]
    )
    prompts = random_prompts([60, 90])
    out = engine.generate(prompts, SamplingConfig(max_new_tokens=1))  # prefill only: the state at the prompt
    cache = caches[0]
    c = tiny_llama.config
    dim, groups = c.num_key_value_heads * c.head_dim, c.num_attention_heads // c.num_key_value_heads
    total = 0
    for b, n in enumerate(out.prompt_lengths.tolist()):
        L, r = n - cfg.resolved.sinks, int(cache.rank_k[b])
        # what the buffers hold for this sequence: sinks K and V, coefficients K and V, query window, bases
        held = (
            2 * cache.sink_k[0, b].numel() + 2 * L * r + cache.cq[0, b].numel() // cache.cq.shape[-1] * r + 2 * dim * r
        )
        formula = 2 * (cfg.resolved.sinks * dim + L * r + 0.5 * groups * cfg.resolved.window * r + dim * r)
        assert held == formula == persistent_elements(cfg.resolved.sinks, L, dim, groups, cfg.resolved.window, r, r)
        ratio = formula / (2 * (cfg.resolved.sinks + L) * dim)
        assert (
            ratio
            <= cfg.resolved.eta
            < formula / (2 * (cfg.resolved.sinks + L) * dim)
            + (L + groups * cfg.resolved.window / 2 + dim) / ((cfg.resolved.sinks + L) * dim)
        )
        total += 4 * held + 8 * groups * L  # float32 state, and the window's float64 score sums
    assert cache.nbytes() == total * c.num_hidden_layers


@pytest.mark.parametrize("expected_length", [None, 150, 0])
def test_eta_is_the_memory_share_where_asked(tiny_llama, expected_length):
    """eta is the persistent-memory share at the end of the generation (prompt + max_new_tokens) unless
    ``expected_length`` says where; each sample reports the share it reached (``memory_share``)."""
    cfg = CompressionConfig.of("s4r", eta=0.3, window=4, expected_length=expected_length)
    r = cfg.resolved
    c = tiny_llama.config
    dim, groups = c.num_key_value_heads * c.head_dim, c.num_attention_heads // c.num_key_value_heads
    new = 64
    out = rollout(tiny_llama, random_prompts(PROMPTS[:3]), cfg, new_tokens=new)
    for n, share in zip(out.prompt_lengths.tolist(), out.memory_share.tolist()):
        at = {None: n + new, 150: 150, 0: n}[expected_length]
        rank = s4r_rank(cfg.resolved.eta, r.sinks, at - r.sinks, dim, groups, r.window)
        T = n + new
        assert share == pytest.approx(
            persistent_elements(r.sinks, T - r.sinks, dim, groups, r.window, rank, rank) / (2 * T * dim)
        )
        if expected_length is None:  # reached at the end: within one rank step below eta
            step = (T - r.sinks + groups * r.window / 2 + dim) / (T * dim)
            assert cfg.resolved.eta - step < share <= cfg.resolved.eta
        if expected_length == 0:  # the prompt-length meaning: the share falls as the generation grows
            assert share < cfg.resolved.eta


def test_memory_share_of_eviction_is_its_retention(tiny_llama):
    out = rollout(tiny_llama, random_prompts(PROMPTS[:3]), CompressionConfig("gkv", budget=32, window=4, interval=8))
    assert torch.equal(out.memory_share, out.retention)


def test_rank_solves_the_memory_equation():
    s, L, dim, G, W = 4, 3000, 192, 3, 32
    r = s4r_rank(0.2, s, L, dim, G, W)

    def ratio(rank):
        return (s * dim + L * rank + 0.5 * G * W * rank + dim * rank) / ((s + L) * dim)

    assert ratio(r) <= 0.2 < ratio(r + 1)
    assert s4r_rank(1.0, s, 10, dim, G, W) <= dim and s4r_rank(0.01, s, 10, dim, G, W) == 1


def test_sampling_split_is_recent_then_uniform():
    picked = sample_positions(100, 20, 0.7)
    assert len(picked) == len(picked.unique()) == 20
    assert picked[-14:].tolist() == list(range(86, 100))  # 7/10 of them: the most recent block
    assert (picked[:6] < 86).all() and picked[0] == 0
    assert sample_positions(10, 20, 0.7).tolist() == list(range(10))


def test_rope_round_trip_and_bits():
    x = torch.randn(2, 3, 5, 8)
    angles = torch.rand(2, 5, 4) * 10
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    assert torch.allclose(inverse_rope(apply_rope(x, cos, sin), cos, sin), x, atol=1e-5)
    mask = torch.rand(3, 4, 21) > 0.5
    assert torch.equal(unpack_bits(pack_bits(mask), 21), mask)


def test_key_rope_matches_the_rotary_module(tiny_llama):
    """Reconstructed keys get RoPE as x * cos + swap_halves(x) * signed_sin, from the position table or (for a
    rotary embedding that depends on the length) from the module: both equal apply_rope with the module's
    cos and sin. The control: unsigned sin differs."""
    caches = []
    engine = RolloutEngine(
        tiny_llama,
        compression=CompressionConfig("s4r", window=4),
        cache_factory=lambda *a: caches.append(make_cache(*a)) or caches[-1],
    )
    engine.generate(random_prompts([20, 12]), SamplingConfig(max_new_tokens=2))
    cache = caches[0]
    x = torch.randn(2, cache.Hkv, 7, cache.D)
    positions = torch.randint(0, cache.length, (2, 7))
    expected = apply_rope(x, *cache.rotary(x, positions))  # [B, Hkv, T, D]
    swapped = x.view(2, cache.Hkv, 7, 2, -1).flip(-2).view_as(x)
    for static in (True, False):
        cache._rope_static = static
        rope = cache._key_rope(x, positions)[:, None]  # [B, 1, T, 2, D]
        torch.testing.assert_close(x * rope[..., 0, :] + swapped * rope[..., 1, :], expected)
    assert not torch.allclose(x * rope[..., 0, :] + swapped * rope[..., 1, :].abs(), expected)


def test_selection_keeps_window_and_top_k():
    score = torch.tensor([[0.9, 0.1, 0.8, 0.2, 0.3, 0.0, 0.05, 0.5]])
    k_pos = torch.arange(4, 12)[None]
    k_ok = torch.ones(1, 8, dtype=torch.bool)
    budget = selection_budget(k_pos, k_ok, torch.tensor([11]), window=2, rho=0.5)
    # window: positions 10, 11 (slots 6, 7); k = floor(0.5 * 8) - 2 = 2 others: slots 0 and 2
    assert budget.k.tolist() == [2] and budget.local[0].nonzero().squeeze(-1).tolist() == [6, 7] and budget.n == 4
    assert select_tokens(score, budget)[0].nonzero().squeeze(-1).tolist() == [0, 2, 6, 7]


def stable_sort_selection(score, k_ok, local, k):
    """The selection by a stable descending sort (of equal scores, the earlier slot), the top k = floor(rho *
    L_t) - window at most: what select_tokens does with one topk and a tie rule."""
    ranked = score.masked_fill(~k_ok | local, float("-inf"))
    values, index = ranked.sort(dim=-1, descending=True, stable=True)
    keep = (torch.arange(ranked.shape[-1])[None, :] < k[:, None]) & values.isfinite()
    return local | torch.zeros_like(k_ok).scatter(-1, index, keep)


def test_selection_breaks_ties_like_a_stable_sort():
    torch.manual_seed(0)
    for i in range(60):
        B, S = 3, 40
        score = torch.randint(0, 5, (B, S)).float() / 4  # many ties, as after max pooling
        lengths = torch.randint(10, S + 1, (B,))
        if i % 2:  # every row chooses as many: the k-th best from an unsorted topk
            lengths[:] = lengths[0]
        k_pos = torch.arange(4, 4 + S).expand(B, -1)
        k_ok = torch.arange(S)[None, :] < lengths[:, None]
        rho = float(torch.rand(1))
        budget = selection_budget(k_pos, k_ok, lengths + 3, window=4, rho=rho)
        k_uncapped = (torch.floor(rho * lengths.double()).long() - 4).clamp_min(0)
        expected = stable_sort_selection(score, k_ok, budget.local, k_uncapped)
        chosen = select_tokens(score, budget)
        assert torch.equal(chosen, expected) and torch.equal(chosen.sum(-1), budget.count)
        assert budget.same_k == bool((budget.k == budget.top).all()) and (budget.same_k or i % 2 == 0)
    # all tied: the earliest slots, not topk's own order among equals
    k_pos, k_ok = torch.arange(4, 44)[None], torch.ones(1, 40, dtype=torch.bool)
    budget = selection_budget(k_pos, k_ok, torch.tensor([43]), window=1, rho=6 / 40)
    chosen = select_tokens(torch.zeros(1, 40), budget)
    assert chosen[0].nonzero().squeeze(-1).tolist() == [0, 1, 2, 3, 4, 39]


def test_chosen_in_order():
    chosen = torch.tensor([[1, 0, 1, 1, 0], [0, 0, 0, 1, 0]], dtype=torch.bool)
    assert chosen_in_order(chosen, 3).tolist() == [[0, 2, 3], [3, 0, 0]]


def test_latent_probs_are_causal_softmaxes():
    torch.manual_seed(0)
    B, G, Q, S, r = 2, 2, 3, 12, 4
    cq, ck, rank = torch.randn(B, G, Q, r), torch.randn(B, S, r), torch.tensor([4, 3])
    q_pos = torch.tensor([[10, 12, 15], [6, 7, 9]])
    q_ok = torch.tensor([[True, True, True], [False, True, True]])
    k_pos = torch.arange(4, 4 + S).expand(B, -1)
    k_ok = k_pos <= torch.tensor([[15], [9]])
    bias = key_bias(hidden_keys(q_pos, q_ok, k_pos, k_ok), G)
    probs = latent_probs(cq, ck, rank.float().rsqrt()[:, None, None, None], bias)
    logits = cq @ ck.transpose(-1, -2)[:, None] / rank.float().sqrt()[:, None, None, None]
    for b in range(B):
        for q in range(Q):
            seen = k_ok[b] & (k_pos[b] <= q_pos[b, q])
            if q_ok[b, q]:
                torch.testing.assert_close(probs[b, :, q, seen], logits[b, :, q, seen].softmax(-1))
                assert not probs[b, :, q, ~seen].any()
            else:  # an invalid query sees everything: a finite row, weighted 0 by the caller
                assert probs[b, :, q].isfinite().all()


def test_window_sum_follows_the_window(tiny_llama):
    """The running sum of the window's softmaxes (one query in, one out per step) equals the sum computed from
    scratch over the last W queries, rows that finished early included; the control: the previous window's."""
    cfg = CompressionConfig.of("s4r", eta=0.3, window=4)
    caches = []
    engine = RolloutEngine(
        tiny_llama, compression=cfg, cache_factory=lambda *a: caches.append(make_cache(*a)) or caches[-1]
    )
    engine.generate(random_prompts([40, 25]), SamplingConfig(max_new_tokens=12, seed=3))
    cache = caches[0]
    S = int(cache.lengths.max()) - cache.s
    k_pos = torch.arange(cache.s, cache.s + S).expand(cache.B, -1)
    k_ok = cache.valid[:, cache.s : cache.s + S]
    for layer in range(cache.L):
        hidden = hidden_keys(cache.q_pos, cache.q_ok, k_pos, k_ok)
        probs = latent_probs(cache.cq[layer], cache.coef_k[layer][:, :S], cache.latent_scale, key_bias(hidden, cache.G))
        probs = probs * cache.q_ok[:, None, :, None]
        window_sum = cache.window_sum[layer][:, :, :S].float()
        torch.testing.assert_close(window_sum, probs.sum(2), rtol=1e-4, atol=1e-6)
        stale = probs[:, :, :-1].sum(2)  # without one of the window's queries
        assert not torch.allclose(window_sum, stale, rtol=1e-4, atol=1e-6)


def test_prompts_shorter_than_sinks_plus_window(tiny_llama):
    """A prompt of s + 1 tokens puts queries at sink positions in the first window: they see no stored key and
    take no part in the scores (no NaN, which would break the top-k count and the attention mask), and the
    trainer reproduces the rollout. The control: counting them as scoring queries gives NaN sums."""
    cfg = CompressionConfig.of("s4r", eta=0.4, window=4, sinks=1)
    caches = []
    engine = RolloutEngine(
        tiny_llama, compression=cfg, cache_factory=lambda *a: caches.append(make_cache(*a)) or caches[-1]
    )
    prompts = random_prompts([2, 3, 7, 2, 5], seed=4)
    out = engine.generate(prompts, SamplingConfig(max_new_tokens=20, temperature=1.0, seed=3, ignore_eos=True))
    cache = caches[0]
    assert cache.window_sum.isfinite().all()
    report = consistency_report(tiny_llama, out)
    assert report["max_abs_logprob_diff"] <= 1e-4
    assert report["causal_mask_diff"] > 1e-2 and report["rotated_layers_diff"] > 1e-2  # controls that must fail
    k_pos = torch.arange(cache.s, cache.s + 4).expand(1, -1)
    sink_query = hidden_keys(torch.tensor([[0]]), torch.tensor([[True]]), k_pos, torch.ones(1, 4, dtype=torch.bool))
    probs = latent_probs(
        cache.cq[0, :1, :, :1], cache.coef_k[0, :1, :4], cache.latent_scale[:1], key_bias(sink_query, cache.G)
    )
    assert probs.isnan().all()


def test_short_prompt_is_a_clear_error(tiny_llama):
    with pytest.raises(ValueError, match="s4r needs prompts longer than its 4 sinks"):
        rollout(tiny_llama, [[5, 6, 7]], CompressionConfig("s4r"))


def test_bad_s4r_options():
    with pytest.raises(ValueError, match="eta must lie in"):
        CompressionConfig.of("s4r", eta=0.0)
    with pytest.raises(ValueError, match="rank must be at least 1"):
        CompressionConfig.of("s4r", rank=0)
    assert CompressionConfig("s4r").resolved.window == 32 and CompressionConfig("s4r").resolved.sinks == 4


@pytest.mark.smollm2
def test_s4r_consistency_smollm2(smollm2, gsm8k_questions):
    model, tokenizer = smollm2
    questions = [gsm8k_questions[i] for i in (0, 3, 7, 12)]
    cfg = CompressionConfig.of("s4r", eta=0.2, window=16)
    out = RolloutEngine(model, tokenizer, cfg).generate(
        questions, SamplingConfig(max_new_tokens=64, temperature=1.0, seed=0, ignore_eos=True)
    )
    assert len(set(out.prompt_lengths.tolist())) > 1
    report = consistency_report(model, out)
    assert report["max_abs_logprob_diff"] <= TOL
    assert report["causal_mask_diff"] > 1e-2 and report["rotated_layers_diff"] > 1e-2


def test_refresh_grows_the_bases_along_the_generation_and_training_follows(tiny_llama):
    """refresh: every 8 tokens each layer's bases gain 2 columns (up to the rank eta gives), which the tokens
    written afterwards use and the earlier ones do not (the record's key_rank / value_rank); the trainer
    reproduces it, and the control that forgets the ranks (every token with every column) does not; rows that
    finish and leave the batch keep the bases they had; the memory reported counts the refresh's buffers."""
    import dataclasses

    from gkv_train.training.consistency import logprob_mismatch

    cfg = CompressionConfig.of("s4r", eta=0.4, window=4, refresh=8, refresh_rank=2)
    prompts = random_prompts(PROMPTS)
    out = rollout(tiny_llama, prompts, cfg, new_tokens=40)
    rec = out.record
    for b, P in enumerate(out.prompt_lengths.tolist()):
        ranks = rec.key_rank[b, P : P + 39].tolist()  # the last sampled token is never fed, so never stored
        start = int(rec.key_rank[b, P - 1])  # the prompt's
        assert ranks == [min(start + 2 * (j // 8), max(ranks)) for j in range(39)] and max(ranks) > start
        assert rec.bases_k[b, :, :, start : max(ranks)].abs().sum() > 0  # the added columns
        gram = rec.bases_k[b, 0, :, : max(ranks)].T @ rec.bases_k[b, 0, :, : max(ranks)]
        assert torch.allclose(gram, torch.eye(max(ranks)), atol=1e-4)  # still orthonormal
    assert logprob_mismatch(tiny_llama, out, rec)["max_abs"] <= TOL
    everything = dataclasses.replace(
        rec,
        key_rank=torch.full_like(rec.key_rank, rec.bases_k.shape[-1]),
        value_rank=torch.full_like(rec.value_rank, rec.bases_v.shape[-1]),
    )
    assert logprob_mismatch(tiny_llama, out, everything)["max_abs"] > 1e-2
    # rows leaving at every finish: the same tokens, records and log-probs as keeping them
    stops = tuple(range(10, 24))
    runs = [
        RolloutEngine(tiny_llama, compression=cfg).generate(
            prompts,
            SamplingConfig(max_new_tokens=40, temperature=1.0, seed=1, stop_token_ids=stops, drop_finished_at=d),
        )
        for d in (1.0, 0.01)
    ]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert torch.allclose(runs[0].logprobs, runs[1].logprobs, atol=1e-5)
    for name, value in runs[0].record.to_batch().items():
        assert torch.allclose(value.float(), runs[1].record.to_batch()[name].float(), atol=1e-5), name
    plain = rollout(tiny_llama, prompts, dataclasses.replace(cfg, options={**cfg.options, "refresh": 0}), new_tokens=40)
    assert (out.memory_share > plain.memory_share).all()  # the last 8 tokens' keys and values are kept too


def test_bench_s4r_refresh_reports_errors_and_decode_cost():
    """scripts/bench_s4r.py --refresh as main, on the tiny model: reconstruction errors of keys and values with and
    without refresh by 128-token stretch, and the decode time of full, s4r and s4r with refresh from one run."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [
            sys.executable,
            str(root / "scripts" / "bench_s4r.py"),
            "--model",
            "tiny",
            "--refresh",
            "8",
            "--context",
            "60",
            "--new-tokens",
            "40",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("s4r", "s4r_refresh"):
        assert all(0 < e < 1 for kind in ("k", "v") for e in line["relative_error_by_128_tokens"][name][kind])
    assert set(line["decode_seconds_per_token"]) == {"full", "s4r", "s4r_refresh"}


def test_bench_s4r_basis_cost_reports_both_bases():
    """scripts/bench_s4r.py --basis-cost as main, on the tiny model: per prompt length the prefill of the full
    cache and of S4R with sampled and whole-prompt bases, S4R's own seconds apart, and its docs table."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, str(root / "scripts" / "bench_s4r.py"), "--model", "tiny", "--basis-cost", "64"]
    done = subprocess.run([*command, "--repeats", "1"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    rows = line["cost"]["64"]
    assert set(rows) == {"full", "s4r_sampled", "s4r_prompt", "prompt_tokens"} and rows["full"]["s4r_seconds"] == 0
    assert all(0 < rows[n]["s4r_seconds"] < rows[n]["prefill_seconds"] for n in ("s4r_sampled", "s4r_prompt"))
    sys.path.insert(0, str(root / "scripts"))
    from bench_s4r import tables

    assert f"| {rows['prompt_tokens']} |" in tables("basis", line) and line["commit"] in tables("basis", line)
