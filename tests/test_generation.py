import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import method_budget, random_prompts, tiny_methods

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.contract.attention import ATTENTION_NAME
from gkv_rollout.contract.eviction import NEVER
from gkv_rollout.engine import RolloutEngine, encode_prompts, left_pad
from gkv_rollout.eviction_cache import EvictionCache
from gkv_rollout.registry import eviction_methods
from gkv_rollout.scoring import hashed_uniform
from gkv_train.models import tiny_model

ROOT = Path(__file__).resolve().parents[1]


def hf_greedy(model, prompts, pad_id, max_new_tokens, eos):
    ids, mask = left_pad(prompts, pad_id, "cpu")
    model.set_attn_implementation("sdpa")
    try:
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=pad_id,
        )
    finally:
        model.set_attn_implementation(ATTENTION_NAME)
    return out[:, ids.shape[1] :]


@pytest.mark.parametrize("kind", ["tiny-llama", "tiny-qwen2", "tiny-qwen3"])
def test_full_greedy_matches_hf_generate(kind):
    model = tiny_model(kind)
    prompts = random_prompts([5, 17, 40, 9])
    out = RolloutEngine(model).generate(prompts, SamplingConfig(max_new_tokens=30, temperature=0, stop_token_ids=(2,)))
    expected = hf_greedy(model, prompts, 0, 30, 2)
    assert torch.equal(out.completion_ids, expected)


@pytest.mark.smollm2
def test_full_greedy_matches_hf_generate_smollm2(smollm2, gsm8k_questions):
    model, tokenizer = smollm2
    prompts = encode_prompts(tokenizer, gsm8k_questions[:4])
    out = RolloutEngine(model, tokenizer).generate(prompts, SamplingConfig(max_new_tokens=24, temperature=0))
    expected = hf_greedy(model, prompts, tokenizer.pad_token_id, 24, tokenizer.eos_token_id)
    assert torch.equal(out.completion_ids, expected[:, : out.completion_ids.shape[1]])


def test_stop_token_ends_each_sequence_on_its_own(tiny_llama):
    prompts = random_prompts([6, 11, 3])
    greedy = RolloutEngine(tiny_llama).generate(
        prompts, SamplingConfig(max_new_tokens=8, temperature=0, stop_token_ids=())
    )
    row0 = greedy.completion_ids[0].tolist()
    first_new = next(i for i in range(1, 8) if row0[i] not in row0[:i])
    stop = row0[first_new]  # a greedy token of row 0, first seen after step 1, becomes the stop token
    out = RolloutEngine(tiny_llama).generate(
        prompts, SamplingConfig(max_new_tokens=8, temperature=0, stop_token_ids=(stop,))
    )
    for row in range(3):
        full = greedy.completion_ids[row].tolist()
        n = full.index(stop) + 1 if stop in full else 8
        assert out.completion_lengths[row] == n
        assert out.completion_ids[row, :n].tolist() == full[:n]
        assert (out.completion_ids[row, n:] == 0).all() and (out.completion_mask[row, n:] == 0).all()
        assert (out.logprobs[row, n:] == 0).all() and (out.logprobs[row, :n] < 0).all()
    assert out.completion_lengths[0] == first_new + 1


def test_ignore_eos_forces_length(tiny_llama):
    prompts = random_prompts([6, 9])
    greedy = RolloutEngine(tiny_llama).generate(
        prompts, SamplingConfig(max_new_tokens=5, temperature=0, stop_token_ids=())
    )
    stop = int(greedy.completion_ids[0, 0])
    out = RolloutEngine(tiny_llama).generate(
        prompts, SamplingConfig(max_new_tokens=5, temperature=1.0, stop_token_ids=(stop,), ignore_eos=True)
    )
    assert out.completion_lengths.tolist() == [5, 5] and stop not in out.completion_ids.flatten().tolist()


def test_sampling_is_seeded_and_repeats_prompts(tiny_llama):
    prompts = random_prompts([4, 7])
    engine = RolloutEngine(tiny_llama, compression=CompressionConfig("gkv", budget=8, window=2, interval=4))
    a = engine.generate(prompts, SamplingConfig(max_new_tokens=12, num_samples=3, seed=5, top_p=0.9))
    b = engine.generate(prompts, SamplingConfig(max_new_tokens=12, num_samples=3, seed=5, top_p=0.9))
    c = engine.generate(prompts, SamplingConfig(max_new_tokens=12, num_samples=3, seed=6, top_p=0.9))
    assert a.sequences.shape[0] == 6 and a.prompt_lengths.tolist() == [4, 4, 4, 7, 7, 7]
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.record.evict_at, b.record.evict_at)
    assert not torch.equal(a.sequences, c.sequences)
    assert not torch.equal(a.completion_ids[0], a.completion_ids[1])  # samples of one prompt differ


def test_top_p_keeps_sampling_inside_the_nucleus():
    from gkv_rollout.sampling import sample_tokens

    logits = torch.tensor([[4.0, 3.0, 0.0, -1.0]]).repeat(200, 1)
    tokens, logprobs = sample_tokens(logits, 1.0, 0.7, torch.rand(200, generator=torch.Generator().manual_seed(0)))
    assert set(tokens.tolist()) <= {0, 1}
    assert torch.allclose(logprobs, logits.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1))


@pytest.mark.parametrize("method", [*eviction_methods(), "gkv-avg"])
def test_padding_changes_nothing(tiny_llama, method):
    """Positions are logical and ties are broken over a row's own tokens: a prompt generates the same tokens and
    record alone and in a padded batch, for every method at its defaults (max pooling makes ties common: with
    one ``topk`` over the padded rows, snapkv's shorter rows keep other tokens than alone)."""
    name, _, pool = method.partition("-")
    cfg = CompressionConfig(name, budget=method_budget(name, 12, 3, 30), window=3, interval=5, pool=pool or "max")
    prompts = random_prompts([9, 30, 17], seed=4)
    sampling = SamplingConfig(max_new_tokens=25, temperature=0, stop_token_ids=())
    engine = RolloutEngine(tiny_llama, compression=cfg)
    batch = engine.generate(prompts, sampling)
    # random draws per row of the rollout: alone, a prompt is row 0, so only the batch's row 0 compares
    rows = [0] if name in ("random", "random_attention") else range(len(prompts))
    for row in rows:
        alone = engine.generate([prompts[row]], sampling)
        assert torch.equal(alone.completion_ids[0], batch.completion_ids[row])
        T = len(prompts[row]) + 25
        assert torch.equal(alone.record.evict_at[0, ..., :T], batch.record.evict_at[row, ..., :T])


def test_random_eviction_is_seeded_and_per_head(tiny_llama):
    """``random`` keeps other tokens with another seed, the same with the same seed, and different ones in each
    layer and KV head; its draws depend only on their coordinates."""
    cfg = CompressionConfig("random", budget=12, window=3, interval=5)
    prompts = random_prompts([9, 30], seed=4)
    engine = RolloutEngine(tiny_llama, compression=cfg)

    def record(seed):
        return engine.generate(prompts, SamplingConfig(max_new_tokens=20, temperature=0, seed=seed)).record.evict_at

    first = record(1)
    assert torch.equal(first, record(1)) and not torch.equal(first, record(2))
    parts = first[1].flatten(0, 1)  # [L * Hkv, T] of the longer sequence
    assert len({tuple(p.tolist()) for p in parts}) == parts.shape[0]
    coords = torch.arange(50)[:, None], torch.arange(4)[None, :]
    assert torch.equal(hashed_uniform(7, *coords)[10:20, 1:3], hashed_uniform(7, coords[0][10:20], coords[1][:, 1:3]))
    assert not torch.equal(hashed_uniform(7, *coords), hashed_uniform(8, *coords))


@pytest.mark.parametrize("scale", [0.01, 1.0, 6.0])  # flat rows need the full-sort fallback
def test_nucleus_is_exact(scale):
    from gkv_rollout.sampling import nucleus

    probs = (torch.randn(8, 3000, generator=torch.Generator().manual_seed(1)) * scale).softmax(-1)
    weights, ids = nucleus(probs, 0.9)
    ref_p, ref_ids = probs.sort(-1, descending=True)
    ref_keep = ref_p.cumsum(-1) - ref_p <= 0.9
    for row in range(8):
        assert set(ids[row][weights[row] > 0].tolist()) == set(ref_ids[row][ref_keep[row]].tolist())


def test_compiled_top_p_sampling_matches_eager():
    """``compile_decode`` compiles the sampler with fullgraph=True: top-p over a vocabulary wider than the nucleus
    probe (where the eager probe branches on the data) samples the eager tokens, in a batch of peaked rows (eager
    takes the probe's top candidates), a batch with flat rows (eager sorts every row), and with banned tokens."""
    from gkv_rollout.sampling import _NUCLEUS_PROBE, sample_tokens

    g = torch.Generator().manual_seed(2)
    peaked = torch.randn(4, 3000, generator=g) * 8.0
    flat = torch.randn(4, 3000, generator=g) * torch.tensor([0.01, 0.01, 1.0, 8.0])[:, None]
    uniform = torch.rand(4, generator=g)
    top = peaked.softmax(-1).topk(_NUCLEUS_PROBE, -1).values.sum(-1)
    assert (top > 0.95).all() and not (flat.softmax(-1).topk(_NUCLEUS_PROBE, -1).values.sum(-1) > 0.95).all()
    compiled = torch.compile(sample_tokens, fullgraph=True)
    banned = peaked.argmax(-1)[:2]  # the likeliest tokens of two rows
    for logits in (peaked, flat):
        for top_p, ban in ((0.5, None), (0.95, None), (0.95, banned)):
            eager_tokens, eager_logprobs = sample_tokens(logits, 0.7, top_p, uniform, ban)
            tokens, logprobs = compiled(logits, 0.7, top_p, uniform, ban)
            assert torch.equal(tokens, eager_tokens)
            assert torch.allclose(logprobs, eager_logprobs)
            assert ban is None or not torch.isin(tokens, ban).any()


def test_inverse_cdf_follows_the_weights():
    from gkv_rollout.sampling import inverse_cdf

    weights = torch.tensor([[0.0, 3.0, 0.0, 1.0]]).repeat(4000, 1)
    draws = inverse_cdf(weights, torch.rand(4000, generator=torch.Generator().manual_seed(0)))
    assert set(draws.tolist()) == {1, 3}
    assert abs((draws == 1).float().mean().item() - 0.75) < 0.03


@pytest.mark.parametrize("method", ["gkv", "h2o", "full"])
@pytest.mark.parametrize("chunk_given", [False, True])
def test_replay_reproduces_a_sampled_rollout(tiny_llama, tiny_llama_fp64, method, chunk_given):
    """Teacher-forcing the sampled completions gives the same record and log-probs: one token per forward
    (``chunk_given=False``) in fp32, the same forwards as sampling; in chunks (the default) in fp64, where the larger
    forward's rounding crosses no top-k boundary (in fp32 it may: ``SamplingConfig.chunk_given``)."""
    model = tiny_llama_fp64 if chunk_given else tiny_llama
    cfg = CompressionConfig(method, budget=12, window=3, interval=5)
    engine = RolloutEngine(model, compression=cfg)
    prompts = random_prompts([9, 30, 17, 4], seed=7)
    sampled = engine.generate(prompts, SamplingConfig(max_new_tokens=28, temperature=1.0, seed=3, top_p=0.9))
    replayed = engine.replay(prompts, sampled.completions(), SamplingConfig(temperature=1.0, chunk_given=chunk_given))
    assert (replayed.stats["forwards"] < replayed.stats["steps"] - 1) == chunk_given
    assert torch.equal(replayed.sequences, sampled.sequences)
    assert torch.equal(replayed.completion_lengths, sampled.completion_lengths)
    assert torch.allclose(replayed.logprobs, sampled.logprobs, atol=1e-6)
    if method != "full":
        assert torch.equal(replayed.record.evict_at, sampled.record.evict_at)


@pytest.mark.parametrize("method", ["gkv", "s4r"])
def test_prefixes_are_fed_then_sampling_goes_on(tiny_llama_fp64, method):
    """Given prefixes begin every sample of their prompt, then sampling goes on: the completions hold them, a
    replay of the completions reproduces the record and the log-probs (fp64: the replay takes the sampled tails in
    chunks too), and the prefix's log-probs are the model's for those tokens. The sampled tails differ between
    samples; a prefix that fills max_new_tokens is refused."""
    tiny_llama = tiny_llama_fp64
    cfg = CompressionConfig(method, budget=12, window=3, interval=5) if method == "gkv" else CompressionConfig(method)
    engine = RolloutEngine(tiny_llama, compression=cfg)
    prompts = random_prompts([9, 17], seed=7)
    prefixes = random_prompts([20, 13], seed=8)  # token ids, as prompts are
    sampling = SamplingConfig(max_new_tokens=30, temperature=1.0, seed=3, num_samples=2, stop_token_ids=())
    out = engine.generate(prompts, sampling, prefixes=prefixes)
    completions = out.completions()
    for row, completion in enumerate(completions):
        assert completion[: len(prefixes[row // 2])] == prefixes[row // 2]
        assert len(completion) == 30
    assert completions[0][20:] != completions[1][20:]  # each sample samples its own tail
    replayed = engine.replay(
        [p for p in prompts for _ in range(2)], completions, dataclasses.replace(sampling, num_samples=1)
    )
    assert torch.equal(replayed.sequences, out.sequences)
    assert torch.allclose(replayed.logprobs, out.logprobs, atol=1e-6)
    if method == "gkv":
        assert out.stats["compressions"] > 3 and torch.equal(replayed.record.evict_at, out.record.evict_at)
    else:
        assert torch.equal(replayed.record.selected, out.record.selected)
    control = engine.generate(prompts, sampling)  # without prefixes: sampled from the first token
    assert control.completions()[0][:20] != prefixes[0]
    with pytest.raises(ValueError, match="leaves nothing to sample within 20"):
        engine.generate(prompts, SamplingConfig(max_new_tokens=20), prefixes=prefixes)
    vocab = tiny_llama.get_input_embeddings().num_embeddings
    rows = (iter(p) for p in prefixes)  # any iterables: once "object of type 'generator' has no len()"
    assert engine.generate(prompts, sampling, prefixes=rows).completions() == out.completions()
    with pytest.raises(ValueError, match="prefixes is int: one list of token ids per prompt"):
        engine.generate(prompts, sampling, prefixes=5)
    for bad, message in [
        ("some text", r"prefixes\[0\] is str: a list of token ids"),
        (5, r"prefixes\[0\] is int: a list of token ids"),
        ([1.5], r"prefixes\[0\] holds 1.5: token ids are integers"),
        ([None], r"prefixes\[0\] holds None"),
        ([-1], r"prefixes\[0\] holds the id -1, outside the vocabulary"),
        ([vocab], f"prefixes\\[0\\] holds the id {vocab}, outside the vocabulary \\(0-{vocab - 1}\\)"),
    ]:
        with pytest.raises(ValueError, match=message):
            engine.generate(prompts, sampling, prefixes=[bad, prefixes[1]])


# every registered method: the eviction family (and G-KV's other forms), the full cache and S4R
EVERY_METHOD = [
    CompressionConfig("full"),
    *tiny_methods(16, 4, 8, 30),
    CompressionConfig.of("s4r", eta=0.3, window=4, sinks=2),
]


def assert_same_rollout(a, b):
    """The same completions and record, log-probs within 1e-5."""
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.attention_mask, b.attention_mask)
    assert (a.logprobs - b.logprobs).abs().max() <= 1e-5
    assert (a.record is None) == (b.record is None)
    if a.record is not None:
        theirs = b.record.to_batch()
        for name, value in a.record.to_batch().items():
            assert torch.equal(value, theirs[name]), name


def given_cases(engine, chunks: bool):
    """Prefixes of different lengths (all rows given for several compression rounds; one shorter than an interval;
    a row without one, which samples from the first token), two samples each, rows finishing and kept in the cache
    or leaving it: each case chunked (the default) and one token per forward, and the replay of the last case's
    completions both ways (every token given)."""
    prompts = random_prompts([9, 23, 14, 30], seed=4)
    rows = [p for p in prompts for _ in range(2)]
    cases = [  # (prefixes, drop_finished_at, whether some forwards take several tokens)
        (random_prompts([61, 37, 45, 29], seed=5), 0.01, chunks),  # 29 given for all: 4 rounds in chunks
        (random_prompts([5, 6, 61, 7], seed=6), 1.0, chunks),  # shorter than an interval
        (random_prompts([20, 0, 33, 12], seed=7), 0.25, None),  # an empty prefix (its rows sample, end, leave)
    ]
    for prefixes, drop, fewer in cases:
        sampling = SamplingConfig(
            max_new_tokens=90, temperature=1.0, seed=6, num_samples=2, stop_token_ids=(10, 11), drop_finished_at=drop
        )
        chunked = engine.generate(prompts, sampling, prefixes=prefixes)
        tokens = engine.generate(prompts, dataclasses.replace(sampling, chunk_given=False), prefixes=prefixes)
        yield chunked, tokens, fewer
    replay = SamplingConfig(max_new_tokens=90, temperature=1.0, seed=6)  # the rollout's length (s4r), seed (random)
    replayed = engine.replay(rows, chunked.completions(), replay)
    yield replayed, engine.replay(rows, chunked.completions(), dataclasses.replace(replay, chunk_given=False)), chunks
    yield replayed, chunked, None


@pytest.mark.parametrize("cfg", EVERY_METHOD, ids=lambda c: f"{c.method}-{c.options.get('form')}")
def test_given_tokens_in_chunks_equal_one_by_one(tiny_llama_fp64, cfg):
    """Given tokens fed up to each compression point in one forward (``chunk_given``, the default) give what one
    forward per token gives: the same completions and record, in fp64, where the larger forward's rounding crosses
    no top-k boundary or cosine test (in fp32 it may, for a method that scores with the model's numbers:
    ``SamplingConfig.chunk_given``), through ``given_cases``. S4R and TOVA act after every token: one per
    forward."""
    engine = RolloutEngine(tiny_llama_fp64, compression=cfg)
    chunks = cfg.method not in ("s4r", "tova")
    for i, (chunked, tokens, fewer) in enumerate(given_cases(engine, chunks)):
        assert_same_rollout(chunked, tokens)
        assert fewer is None or (chunked.stats["forwards"] < tokens.stats["forwards"]) == fewer
        if i < 3:  # the sampled cases
            assert tokens.stats["forwards"] == tokens.stats["steps"] - 1
            assert 0 < chunked.stats["given_seconds"] <= chunked.stats["decode_seconds"]
            assert cfg.method in ("full", "s4r") or chunked.stats["compressions"] >= 6
            assert int((chunked.completion_lengths < 90).sum()) >= 2  # rows finish early


@pytest.mark.parametrize("method", ["full", "streaming", "random", "random_attention"])
def test_given_tokens_in_chunks_in_fp32(tiny_llama, method):
    """In fp32 the cases of ``given_cases`` for the methods whose kept sets do not depend on the model's numbers
    (positions, random draws): the same completions and records, log-probs within 1e-5 (the larger forward's
    rounding)."""
    cfg = CompressionConfig(method, budget=method_budget(method, 16, 4, 30), window=4, interval=8)
    for chunked, tokens, fewer in given_cases(RolloutEngine(tiny_llama, compression=cfg), True):
        assert_same_rollout(chunked, tokens)
        assert fewer is None or (chunked.stats["forwards"] < tokens.stats["forwards"]) == fewer


def test_chunks_leave_the_window_queries_where_one_token_forwards_do(tiny_llama_fp64):
    """At every compression the window holds the same queries in the same slots (positions and validity exactly,
    the queries themselves to fp64 rounding) whether given tokens went through in chunks or one per forward: the
    window (3) divides neither the interval (8) nor the chunks that end a prefix, where a ring refilled from its
    current slot by each chunk would put them elsewhere (and the scores would sum in another order)."""
    from gkv_rollout.engine import make_cache

    def snapshots(chunk_given: bool) -> list:
        taken = []

        def factory(*args):
            cache = make_cache(*args)
            compress = cache.compress

            def snapshot():
                taken.append((cache.query_pos.clone(), cache.query_ok.clone(), [q.clone() for q in cache.queries]))
                compress()

            cache.compress = snapshot
            return cache

        engine = RolloutEngine(tiny_llama_fp64, compression=cfg, cache_factory=factory)
        sampling = SamplingConfig(max_new_tokens=70, temperature=1.0, seed=3, chunk_given=chunk_given)
        out = engine.generate(random_prompts([30, 20], seed=4), sampling, prefixes=random_prompts([45, 29], seed=5))
        return taken, out

    cfg = CompressionConfig("gkv", budget=16, window=3, interval=8)
    (chunked, out), (tokens, _) = snapshots(True), snapshots(False)
    assert out.stats["forwards"] < out.stats["steps"] - 1 and len(chunked) == len(tokens) >= 6
    for (pos, ok, queries), (their_pos, their_ok, their_queries) in zip(chunked, tokens):
        assert torch.equal(pos, their_pos) and torch.equal(ok, their_ok)
        # (the queries of a forward of several tokens round differently: ~1e-15 in fp64; a query in another slot
        # differs by its size, ~1)
        assert all(torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(queries, their_queries))


def test_the_full_cache_takes_at_most_full_span_given_tokens_per_forward(tiny_llama):
    """The full cache has no compression point to stop at: a forward takes at most ``FULL_SPAN`` (128) given
    tokens, so a long given beginning goes through in several (and its attention scores stay within 128 decode
    steps' worth), up to the end of the shortest one, then one token per forward."""
    from gkv_rollout.engine import make_cache
    from gkv_rollout.eviction_cache import FULL_SPAN

    widths = []

    def factory(*args):
        cache = make_cache(*args)
        begin = cache.begin

        def spy(positions, valid, static=False):
            widths.append(positions.shape[1])
            return begin(positions, valid, static)

        cache.begin = spy
        return cache

    engine = RolloutEngine(tiny_llama, compression=CompressionConfig("full"), cache_factory=factory)
    sampling = SamplingConfig(max_new_tokens=340, temperature=1.0, seed=1, stop_token_ids=())
    engine.generate(random_prompts([9, 14], seed=2), sampling, prefixes=random_prompts([300, 310], seed=3))
    assert FULL_SPAN == 128 and widths[:4] == [14, 128, 128, 44] and set(widths[4:]) == {1}


def test_a_model_that_changes_its_logits_after_the_head_is_refused(tiny_llama):
    """Given tokens' log-probs (and the trainer's) come from the bare LM head: a model whose causal LM softcaps or
    scales its logits after it (Gemma 2's ``final_logit_softcapping``) is refused, since its bare head is not what
    it samples from; the control: tiny-llama."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    config = Gemma2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        final_logit_softcapping=0.01,
    )
    model = Gemma2ForCausalLM(config).eval()
    ids = torch.tensor([[1, 5, 9]])
    with torch.no_grad():
        capped = model(input_ids=ids).logits[:, -1]
        bare = model.lm_head(model.model(input_ids=ids).last_hidden_state[:, -1])
    assert (capped - bare).abs().max() > 1e-2  # the bare head is not the model's logits
    with pytest.raises(ValueError, match="final_logit_softcapping=0.01 in its configuration"):
        RolloutEngine(model)
    RolloutEngine(tiny_llama)


@pytest.mark.parametrize("value", ["no", 0, None])
def test_chunk_given_is_true_or_false(value):
    """A string would be true whatever it says: only a bool is taken."""
    with pytest.raises(ValueError, match="chunk_given must be True or False"):
        SamplingConfig(chunk_given=value)


def test_a_chunk_past_the_compression_point_changes_the_record(tiny_llama_fp64, monkeypatch):
    """The control of the equality above: forwards of given tokens that run one token past each compression point
    (so the cache compresses one token late) give another record, and the comparison fails (in fp64, as there)."""
    cfg = CompressionConfig("gkv", budget=16, window=4, interval=8)
    engine = RolloutEngine(tiny_llama_fp64, compression=cfg)
    prompts, prefixes = random_prompts([30, 26], seed=4), random_prompts([61, 45], seed=5)  # prompts past the budget
    sampling = SamplingConfig(max_new_tokens=80, temperature=1.0, seed=6)
    tokens = engine.generate(prompts, dataclasses.replace(sampling, chunk_given=False), prefixes=prefixes)
    span, after = EvictionCache.forward_span, EvictionCache.after_step
    monkeypatch.setattr(EvictionCache, "forward_span", lambda cache, generated: span(cache, generated) + 1)
    monkeypatch.setattr(EvictionCache, "after_step", lambda cache, generated: after(cache, generated - 1))
    late = engine.generate(prompts, sampling, prefixes=prefixes)
    assert (
        late.stats["compressions"] == tokens.stats["compressions"] and late.stats["forwards"] < tokens.stats["forwards"]
    )
    with pytest.raises(AssertionError):
        assert_same_rollout(late, tokens)


@pytest.mark.parametrize("method", ["full", "gkv", "snapkv", "s4r", "random_attention"])
def test_dropping_finished_rows_changes_nothing(tiny_llama, method):
    """Finished sequences leaving the batch (at every finish) give the same tokens, log-probs and record as
    keeping them to the end (each row's kept prompt follows it: ``random_attention``); the control: a different
    seed gives different tokens."""
    cfg = (
        CompressionConfig(method, window=3)
        if method == "s4r"
        else CompressionConfig(method, budget=method_budget(method, 12, 3, 30), window=3, interval=5)
    )
    engine = RolloutEngine(tiny_llama, compression=cfg)
    prompts = random_prompts([9, 30, 17, 12, 25, 8], seed=2)
    stops = tuple(range(10, 24))  # about one token in nine: rows end at many different steps
    runs = {}
    for drop in (1.0, 0.01):
        sampling = SamplingConfig(
            max_new_tokens=40,
            temperature=1.0,
            top_p=0.95,
            num_samples=2,
            seed=1,
            stop_token_ids=stops,
            drop_finished_at=drop,
        )
        runs[drop] = engine.generate(prompts, sampling)
    kept, dropped = runs[1.0], runs[0.01]
    assert len(set(kept.completion_lengths.tolist())) > 4 and int(kept.completion_lengths.min()) < 20
    assert torch.equal(kept.sequences, dropped.sequences) and torch.equal(kept.attention_mask, dropped.attention_mask)
    assert torch.allclose(kept.logprobs, dropped.logprobs, atol=1e-5)
    assert torch.allclose(kept.retention, dropped.retention)
    if method != "full":
        for name, value in kept.record.to_batch().items():
            assert torch.equal(value, dropped.record.to_batch()[name]), name
    replayed = engine.replay(
        [p for p in prompts for _ in range(2)],
        dropped.completions(),
        # the rollout's max_new_tokens (s4r's rank) and seed (random_attention's draws); one token per forward, as
        # sampled (chunks are compared in test_given_tokens_in_chunks_equal_one_by_one)
        SamplingConfig(max_new_tokens=40, temperature=1.0, seed=1, drop_finished_at=0.01, chunk_given=False),
    )
    assert torch.equal(replayed.sequences, kept.sequences) and torch.allclose(
        replayed.logprobs, kept.logprobs, atol=1e-5
    )
    other = engine.generate(
        prompts, SamplingConfig(max_new_tokens=40, temperature=1.0, num_samples=2, seed=2, stop_token_ids=stops)
    )
    assert not torch.equal(other.sequences, kept.sequences)


@pytest.mark.parametrize("method", ["snapkv", "rkv"])
def test_rows_leaving_keep_the_compression_steps(tiny_llama, method):
    """Long prompts that end at once leave short-prompt rows within budget: the batch still compresses on the
    same steps (a compression compacts every row's slots, which decides how later top-k ties are broken), so
    dropping the finished rows changes no record. Max pooling makes ties common."""
    engine = RolloutEngine(tiny_llama, compression=CompressionConfig(method, budget=24, window=3, interval=4))
    prompts = random_prompts([60, 6, 60, 5], seed=3)
    completions = [c[:n] for c, n in zip(random_prompts([70] * 4, seed=4), [2, 70, 3, 70])]
    runs = [
        engine.replay(prompts, completions, SamplingConfig(temperature=1.0, drop_finished_at=d)) for d in (1.0, 0.01)
    ]
    assert runs[0].stats["compressions"] == runs[1].stats["compressions"] > 10
    assert torch.equal(runs[0].record.evict_at, runs[1].record.evict_at)
    assert torch.allclose(runs[0].logprobs, runs[1].logprobs, atol=1e-5)


def test_rows_leaving_keep_each_rows_prompt(tiny_llama):
    """``keep_prompt`` with rows leaving: each remaining row keeps its own prompt (short-prompt rows go on after the
    long-prompt rows left), so dropping finished rows changes no record."""
    cfg = CompressionConfig("random_attention", budget=40, window=3, interval=4)
    engine = RolloutEngine(tiny_llama, compression=cfg)
    prompts = random_prompts([30, 6, 28, 5], seed=3)
    completions = [c[:n] for c, n in zip(random_prompts([70] * 4, seed=4), [2, 70, 3, 70])]
    runs = [
        engine.replay(prompts, completions, SamplingConfig(temperature=1.0, drop_finished_at=d)) for d in (1.0, 0.01)
    ]
    assert runs[0].stats["compressions"] == runs[1].stats["compressions"] > 5
    assert torch.equal(runs[0].record.evict_at, runs[1].record.evict_at)
    for row in (1, 3):
        evict_at = runs[1].record.evict_at[row]
        assert (evict_at[..., : len(prompts[row])] == NEVER).all() and (evict_at < NEVER).any()


def test_progress_callback_counts_every_generated_token(tiny_llama):
    """generate(progress=...) is told each step's new tokens: they add up to the completions' tokens."""
    from gkv_rollout.config import CompressionConfig, SamplingConfig
    from gkv_rollout.engine import RolloutEngine
    from gkv_train.models import random_prompts

    counts = []
    engine = RolloutEngine(tiny_llama, compression=CompressionConfig("gkv", budget=16, window=4, interval=8))
    out = engine.generate(
        random_prompts([12, 30, 7]), SamplingConfig(max_new_tokens=24, seed=3), progress=counts.append
    )
    assert sum(counts) == int(out.completion_lengths.sum()) and len(counts) == out.num_completion_tokens
    counts.clear()  # given tokens that go through several at a time are counted as they are appended
    out = engine.generate(
        random_prompts([12, 30, 7]),
        SamplingConfig(max_new_tokens=40, seed=3),
        progress=counts.append,
        prefixes=random_prompts([20, 25, 30]),
    )
    assert sum(counts) == int(out.completion_lengths.sum()) and len(counts) < out.num_completion_tokens


def test_compare_rollouts_finds_a_changed_rollout(tmp_path):
    """scripts/compare_rollouts.py (behaviour across a refactor): a tree against itself is identical; the control, one
    log-prob changed in one method's dump, is found and fails."""
    script = [sys.executable, str(ROOT / "scripts" / "compare_rollouts.py")]
    before = tmp_path / "before.pt"
    subprocess.run([*script, "--dump", str(before)], check=True, capture_output=True, timeout=600)
    same = subprocess.run([*script, "--compare", str(before), str(before)], capture_output=True, text=True, timeout=120)
    assert same.returncode == 0 and json.loads(same.stdout)["identical"]
    dumped = torch.load(before)
    dumped["gkv"]["logprobs"][0, 0] += 1e-6
    torch.save(dumped, tmp_path / "after.pt")
    changed = subprocess.run(
        [*script, "--compare", str(before), str(tmp_path / "after.pt")], capture_output=True, text=True, timeout=120
    )
    assert changed.returncode == 1 and json.loads(changed.stdout)["rollouts"]["gkv"] == "different"
