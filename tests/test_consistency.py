"""Training sees exactly what inference saw: trainer log-probs under the record equal the rollout's."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from conftest import method_budget, random_prompts, tiny_methods

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.contract import attention
from gkv_rollout.contract.eviction import NEVER
from gkv_rollout.engine import RolloutEngine
from gkv_train.logprobs import token_logprobs
from gkv_train.models import tiny_model
from gkv_train.training.consistency import consistency_report

TOL = 1e-4


def check(model, out, cfg):
    assert out.stats["compressions"] >= 3
    phases = out.stats["compress_phase_seconds"]  # the cache's phases add up to its compression time
    assert all(t > 0 for t in phases.values()) and abs(sum(phases.values()) - out.stats["compress_seconds"]) < 1e-9
    report = consistency_report(model, out)
    diff, causal, rotated = report["max_abs_logprob_diff"], report["causal_mask_diff"], report["rotated_layers_diff"]
    assert diff <= TOL, f"{cfg}: trainer vs rollout {diff}"
    assert causal > 1e-2, f"{cfg}: a plain causal mask should not reproduce the rollout ({causal})"
    if cfg.method == "streaming":
        # Sinks + recency evict the same tokens in every layer and head: rotating layers cannot change anything.
        assert (out.record.evict_at == out.record.evict_at[:, :1, :1]).all() and rotated is None
    else:
        assert rotated > 1e-2, f"{cfg}: masks rotated by one layer should not reproduce the rollout ({rotated})"


@pytest.mark.floor
@pytest.mark.parametrize("cfg", tiny_methods(16, 4, 8, 30), ids=lambda c: f"{c.method}-{c.options.get('form')}")
def test_consistency_tiny(tiny_llama, cfg):
    prompts = random_prompts([5, 23, 12, 30, 9])
    out = RolloutEngine(tiny_llama, compression=cfg).generate(
        prompts, SamplingConfig(max_new_tokens=40, temperature=1.0, seed=1)
    )
    check(tiny_llama, out, cfg)


def kept_after_compressions(evict_at: torch.Tensor) -> dict[int, torch.Tensor]:
    """One row's record evict_at int32 [L, Hkv, T] -> {stamp s: int64 [L, Hkv] keys kept by the compression that
    stamped s (k < s and evict_at[k] > s)}, one entry per compression that evicted something."""
    stamps = evict_at[evict_at < NEVER].unique().tolist()
    return {s: (evict_at[..., :s] > s).sum(-1) for s in stamps}


KEPT_PROMPTS = [5, 12, 9, 14, 3]  # different prompt lengths per row, the longest 14 tokens


@pytest.mark.parametrize(
    "cfg",
    [dataclasses.replace(c, keep_prompt=True) for c in tiny_methods(24, 4, 8, max(KEPT_PROMPTS))],
    ids=lambda c: f"{c.method}-{c.options.get('form')}",
)
def test_consistency_keep_prompt(tiny_llama, cfg):
    """``keep_prompt`` for every eviction method: the record stays exact (trainer = rollout; the causal-mask and
    rotated-layer controls fail); no position of a row's own prompt is ever evicted, while without the option some
    are (the control); every compression of a row leaves each (layer, KV head) exactly ``budget`` tokens, its
    prompt among them (rows of different prompt lengths, left-padded)."""
    sampling = SamplingConfig(max_new_tokens=48, temperature=1.0, seed=1, stop_token_ids=())
    out = RolloutEngine(tiny_llama, compression=cfg).generate(random_prompts(KEPT_PROMPTS), sampling)
    check(tiny_llama, out, cfg)
    evict_at = out.record.evict_at
    for row, prompt in enumerate(out.prompt_lengths.tolist()):
        assert (evict_at[row, ..., :prompt] == NEVER).all(), f"{cfg.method}: row {row}'s prompt evicted"
        kept = kept_after_compressions(evict_at[row])
        assert kept and all((n == cfg.budget).all() for n in kept.values()), (cfg.method, row, kept)
    assert out.stats["compressions"] >= 3
    plain = RolloutEngine(tiny_llama, compression=dataclasses.replace(cfg, keep_prompt=False)).generate(
        random_prompts(KEPT_PROMPTS), sampling
    )
    lost = [(plain.record.evict_at[row, ..., :p] < NEVER).any() for row, p in enumerate(KEPT_PROMPTS)]
    assert any(lost), f"{cfg.method} without keep_prompt evicts no prompt token: the test could not fail"


def test_keep_prompt_keeps_each_rows_own_prompt(tiny_llama):
    """The kept prompt is each row's own (positions below its prompt length), not the batch's longest: StreamingLLM
    without sinks keeps the prompt and the newest tokens, so each row's first generated token is the first evicted,
    in every layer and KV head, and no prompt position ever is."""
    cfg = CompressionConfig("streaming", budget=24, window=4, interval=8, sinks=0, keep_prompt=True)
    out = RolloutEngine(tiny_llama, compression=cfg).generate(
        random_prompts(KEPT_PROMPTS), SamplingConfig(max_new_tokens=40, temperature=1.0, seed=2, stop_token_ids=())
    )
    for row, prompt in enumerate(KEPT_PROMPTS):
        evict_at = out.record.evict_at[row]
        assert (evict_at[..., :prompt] == NEVER).all() and (evict_at[..., prompt] < NEVER).all(), row
        assert (evict_at[..., prompt, None] <= evict_at[..., prompt + 1 :]).all(), row


@pytest.mark.parametrize("kind", ["tiny-qwen2", "tiny-qwen3"])
def test_consistency_other_architectures(kind):
    model = tiny_model(kind)
    cfg = CompressionConfig("gkv", budget=16, window=4, interval=8)
    out = RolloutEngine(model, compression=cfg).generate(
        random_prompts([5, 23, 12, 30]), SamplingConfig(max_new_tokens=40, seed=3)
    )
    check(model, out, cfg)


def test_full_consistency_and_chunking(tiny_llama):
    out = RolloutEngine(tiny_llama).generate(random_prompts([5, 23, 12]), SamplingConfig(max_new_tokens=20, seed=4))
    assert out.record is None and (out.retention == 1).all()
    args = (tiny_llama, out.sequences, out.attention_mask, out.num_completion_tokens)
    whole = token_logprobs(*args)
    chunked = token_logprobs(*args, chunk_tokens=7)
    mask = out.completion_mask.bool()
    assert (whole - out.logprobs)[mask].abs().max() <= TOL
    assert torch.allclose(whole, chunked)


def sdpa_calls(monkeypatch, forward) -> list[tuple]:
    """Every ``scaled_dot_product_attention`` call of ``forward()``: its shapes, mask (None, or its shape and
    values), ``is_causal``, ``enable_gqa`` and scale."""
    calls, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        mask = None if attn_mask is None else (tuple(attn_mask.shape), attn_mask.clone())
        calls.append((query.shape, key.shape, value.shape, mask, is_causal, enable_gqa, scale))
        return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)

    with monkeypatch.context() as patch:
        patch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
        forward()
    return calls


def same_calls(ours: list[tuple], theirs: list[tuple]) -> bool:
    def same(a, b):
        return (a is None and b is None) or (
            a is not None and b is not None and a[0] == b[0] and torch.equal(a[1], b[1])
        )

    return len(ours) == len(theirs) and all(
        a[:3] == b[:3] and same(a[3], b[3]) and a[4:] == b[4:] for a, b in zip(ours, theirs)
    )


@pytest.mark.parametrize("lengths", [[14, 14], [5, 14]], ids=["unpadded", "left-padded"])
def test_a_record_that_evicts_nothing_attends_through_sdpa_as_trl_does(tiny_llama, lengths, monkeypatch):
    """Rows that never went over the budget (rl_full's case: a causal record): the training forward under their
    record calls SDPA exactly as TRL's forward does, the model called with the padding mask and nothing else
    (``is_causal`` and no mask without padding, transformers' [B, 1, T, T] mask with it; grouped-query as SDPA
    does it), and its log-probs equal the rollout's. Control: a record that evicts attends through its masks."""
    from gkv_rollout.contract import attention_context
    from gkv_train.logprobs import logical_forward

    def calls_under(out):
        ids, mask = out.sequences, out.attention_mask
        context = attention_context(out.record, tiny_llama, mask)

        def ours():
            with logical_forward(tiny_llama, context):
                tiny_llama(input_ids=ids, attention_mask=mask)

        return sdpa_calls(monkeypatch, ours), sdpa_calls(
            monkeypatch, lambda: tiny_llama(input_ids=ids, attention_mask=mask)
        )

    sampling = SamplingConfig(max_new_tokens=20, ignore_eos=True, stop_token_ids=(), seed=2)
    prompts = random_prompts(lengths)
    out = RolloutEngine(tiny_llama, compression=CompressionConfig("gkv", budget=64, window=4, interval=4)).generate(
        prompts, sampling
    )
    assert out.record is not None and out.stats["compressions"] == 0
    ours, trl = calls_under(out)
    assert len(trl) == tiny_llama.config.num_hidden_layers and (trl[0][3] is None) == (lengths[0] == lengths[1])
    assert same_calls(ours, trl)
    lp = token_logprobs(tiny_llama, out.sequences, out.attention_mask, out.num_completion_tokens, out.record)
    assert (lp - out.logprobs)[out.completion_mask.bool()].abs().max() <= TOL

    evicting = RolloutEngine(tiny_llama, compression=CompressionConfig("gkv", budget=12, window=4, interval=4))
    out = evicting.generate(prompts, sampling)
    assert out.stats["compressions"] > 0
    ours, trl = calls_under(out)
    assert not same_calls(ours, trl)


def test_flex_backend_matches_sdpa(tiny_llama):
    cfg = CompressionConfig("gkv", budget=12, window=4, interval=4)
    out = RolloutEngine(tiny_llama, compression=cfg).generate(
        random_prompts([5, 14]), SamplingConfig(max_new_tokens=12)
    )
    args = (tiny_llama, out.sequences, out.attention_mask, out.num_completion_tokens, out.record)
    with torch.no_grad():  # FlexAttention has no backward on CPU
        flex = token_logprobs(*args, backend="flex")
    mask = out.completion_mask.bool()
    assert (flex - out.logprobs)[mask].abs().max() <= TOL


def test_masked_logprobs_are_differentiable(tiny_llama):
    cfg = CompressionConfig("gkv", budget=12, window=4, interval=4)
    out = RolloutEngine(tiny_llama, compression=cfg).generate(
        random_prompts([5, 14]), SamplingConfig(max_new_tokens=12)
    )
    lp = token_logprobs(
        tiny_llama, out.sequences, out.attention_mask, out.num_completion_tokens, out.record, chunk_tokens=5
    )
    (lp * out.completion_mask).sum().backward()
    grads = [p.grad for p in tiny_llama.parameters()]
    assert all(g is not None for g in grads) and sum(g.abs().sum() for g in grads) > 0
    tiny_llama.zero_grad(set_to_none=True)


RECORDED = pytest.mark.parametrize(
    "cfg",
    [CompressionConfig("gkv", budget=12, window=4, interval=4), CompressionConfig.of("s4r", eta=0.3, window=4)],
    ids=["gkv", "s4r"],
)


def loss_and_grads(model, out, record, checkpointing: bool = False):
    """The summed log-prob loss of a rollout ``out``'s completions under ``record`` and every parameter's gradient,
    with or without activation checkpointing."""
    # transformers 5.23 renamed gradient_checkpointing_* to activation_checkpointing_* (the floor has the old names)
    prefix = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
    enable, disable = (getattr(model, f"{prefix}_checkpointing_{what}") for what in ("enable", "disable"))
    enable({"use_reentrant": False}) if checkpointing else disable()
    lp = token_logprobs(model, out.sequences, out.attention_mask, out.num_completion_tokens, record)
    loss = -(lp * out.completion_mask).sum()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return lp.detach(), loss.detach(), grads


@RECORDED
def test_gradient_checkpointing_under_the_record_gives_the_same_loss_and_gradients(cfg):
    """Activation checkpointing (``gradient_checkpointing=true``: each layer's forward recomputed in the backward)
    under a record: the recomputed layers attend through the same per-layer masks, so the loss and every gradient
    equal those without it (a control: a record rotated by one layer changes them)."""
    model = tiny_model("tiny-llama")
    out = RolloutEngine(model, compression=cfg).generate(random_prompts([9, 21]), SamplingConfig(max_new_tokens=16))
    model.train()
    calls = []
    model.model.layers[0].self_attn.register_forward_hook(lambda *_: calls.append(1))  # inside the checkpoint

    _, plain, grads = loss_and_grads(model, out, out.record)
    forwards, calls[:] = len(calls), []
    _, recomputed, recomputed_grads = loss_and_grads(model, out, out.record, checkpointing=True)
    assert (forwards, len(calls)) == (1, 2)  # the layer ran again in the backward
    assert torch.allclose(plain, recomputed, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, recomputed_grads))
    _, rotated, _ = loss_and_grads(model, out, out.record.roll_layers(1), checkpointing=True)
    assert (rotated - plain).abs() > 1e-3


@RECORDED
@pytest.mark.parametrize("checkpointing", [False, True], ids=["layers-kept", "layers-recomputed"])
def test_masks_built_by_query_chunks_give_the_same_logprobs_and_gradients(cfg, checkpointing, monkeypatch):
    """A training forward builds each layer's mask ``QUERY_CHUNK`` query rows at a time and recomputes each
    chunk in the backward (so no layer keeps its mask for the backward): with chunks of 5 rows the log-probs
    equal the rollout's (<= 1e-4) and one mask's, the gradients equal one mask's, with and without activation
    checkpointing, and every chunk's masked attention ran again in the backward (a count); a chunk attends only
    to the keys its rows see (a bound on the key columns of all calls; ``test_visible_columns`` checks each case)."""
    model = tiny_model("tiny-llama")
    out = RolloutEngine(model, compression=cfg).generate(random_prompts([9, 21]), SamplingConfig(max_new_tokens=16))
    model.train()
    whole_lp, whole, grads = loss_and_grads(model, out, out.record, checkpointing)
    calls = []
    sdpa = attention.sdpa_with_head_mask
    monkeypatch.setattr(attention, "sdpa_with_head_mask", lambda *a, **k: calls.append(a[1].shape[2]) or sdpa(*a, **k))
    monkeypatch.setattr(attention, "QUERY_CHUNK", 5)
    chunked_lp, chunked, chunked_grads = loss_and_grads(model, out, out.record, checkpointing)
    T, layers = out.sequences.shape[1], model.config.num_hidden_layers
    chunks = -(-T // 5)
    assert len(calls) == layers * chunks * (3 if checkpointing else 2)  # forward, (layer recompute,) chunk recompute
    # the chunks attend to fewer keys: about half under G-KV's causal record; under S4R's, whose forward has 2T
    # keys (exact, then projected), fewer than T (the keys up to the last one seen would be more than T)
    assert sum(calls) < 0.7 * len(calls) * T
    mask = out.completion_mask.bool()
    assert (chunked_lp - out.logprobs)[mask].abs().max() <= TOL
    assert torch.allclose(chunked_lp, whole_lp, atol=1e-6) and torch.allclose(chunked, whole, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, chunked_grads))
    rotated_lp, _, _ = loss_and_grads(model, out, out.record.roll_layers(1), checkpointing)  # controls, chunked too
    causal_lp, _, _ = loss_and_grads(model, out, None, checkpointing)
    assert (rotated_lp - out.logprobs)[mask].abs().max() > 1e-2 and (causal_lp - out.logprobs)[mask].abs().max() > 1e-2


def test_eviction_columns_come_from_the_record_and_cover_every_key_seen():
    """An eviction record names each chunk's key columns without building its mask (``layer_columns``): every
    key a query row of the chunk sees is among them, and the mask built over them (``layer_mask(..., columns)``)
    is the whole mask's restriction to them; per (sequence, KV head) far fewer than the prefix once the budget is
    small against the length, also in chunks where a row has ended (its padding queries see its first token).
    Left- and right-padded rows; a control: a column taken away loses a key some row sees."""
    model = tiny_model("tiny-llama")
    cfg = CompressionConfig("gkv", budget=12, window=4, interval=4)
    engine = RolloutEngine(model, compression=cfg)
    prompts = random_prompts([9, 21])
    full = engine.generate(prompts, SamplingConfig(max_new_tokens=100, ignore_eos=True, stop_token_ids=()))
    out = engine.replay(prompts, [c if i else c[:70] for i, c in enumerate(full.completions())])  # row 0 ends early
    masks = out.record.attention_context(model, out.attention_mask, backend="sdpa")
    T, chunk, gathered = out.sequences.shape[1], 8, 0
    for layer in range(model.config.num_hidden_layers):
        for start in range(0, T, chunk):
            end = min(start + chunk, T)
            whole = masks.layer_mask(layer, T, start, end)  # [B, Hkv, Q, T]
            columns = masks.layer_columns(layer, T, start, end)
            restricted = attention.mask_columns(whole, columns)
            assert int(restricted.sum()) == int(whole.sum())  # nothing seen outside the columns
            assert torch.equal(masks.layer_mask(layer, T, start, end, columns), restricted)
            if not isinstance(columns, slice):
                gathered += 1
                assert columns.shape[-1] <= cfg.budget + cfg.interval + chunk < end
                assert int(attention.mask_columns(whole, columns[..., 1:]).sum()) < int(whole.sum())  # control
    late = len(range(40, T, chunk))  # the chunks past the budget, row 0's end (column 88) among them
    assert gathered == model.config.num_hidden_layers * late


CASES = ["causal", "padded", "gathered", "per-head", "per-sequence", "none-seen"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c)
def test_visible_columns(case, monkeypatch):
    """``masked_attention`` restricted to the columns each chunk's rows see (``visible_columns``) gives what one
    unrestricted call gives, outputs and gradients, on synthetic masks: causal (a slice per chunk); a left-padded
    row whose padding queries see its first real token in a later column (kept); most keys unseen (a gather); a
    mask per KV head; each sequence and KV head keeping other keys, which together are every key (a gather per
    sequence and head, padded with unseen columns); a chunk that sees no key (every column)."""
    torch.manual_seed(0)
    B, H, Hkv, T, D = 2, 4, 2, 12, 8
    query, key, value = (torch.randn(B, h, T, D, requires_grad=True) for h in (H, Hkv, Hkv))
    causal = torch.ones(T, T).tril().bool()
    mask = causal.expand(B, 1, T, T).clone()
    if case == "padded":
        mask[0, :, :5] = False
        mask[0, :, :5, 5] = True  # row 0: five padding columns whose queries see the first real token
        mask[0, :, :, :5] = False
    elif case == "gathered":
        mask[:, :, 6:, 1:6] = False  # the last chunks see the first key and the recent ones only
    elif case == "per-head":
        mask = mask.expand(B, Hkv, T, T).clone()
        mask[:, 1, 6:, :4] = False
    elif case == "per-sequence":
        mask = mask.expand(B, Hkv, T, T).clone()
        mask[:, :, 9:, :9] = False  # the last chunk: each (sequence, KV head) keeps its own earlier keys
        for (b, h), kept in {(0, 0): [0, 1, 2], (0, 1): [3, 4, 5], (1, 0): [6, 7, 8], (1, 1): [1]}.items():
            mask[b, h, 9:, kept] = True
    elif case == "none-seen":
        mask[:, :, :3] = False
    gathered = torch.tensor([0, 6, 7, 8]).expand(B, 1, 4)  # 4 of 9 for every sequence
    per_sequence = torch.tensor(
        [[[0, 1, 2, 9, 10, 11], [3, 4, 5, 9, 10, 11]], [[6, 7, 8, 9, 10, 11], [1, 9, 10, 11, 0, 2]]]
    )
    expected = {
        "causal": [slice(0, 3), slice(0, 6), slice(0, 9), slice(0, 12)],
        "padded": [torch.tensor([[[5, 0, 1]], [[0, 1, 2]]]), slice(0, 6), slice(0, 9), slice(0, 12)],  # 1 and 3 of 6
        "gathered": [slice(0, 3), slice(0, 6), gathered, slice(0, 12)],  # 4 of 9; 7 of 12
        "per-head": [slice(0, 3), slice(0, 6), slice(0, 9), slice(0, 12)],
        "per-sequence": [slice(0, 3), slice(0, 6), slice(0, 9), per_sequence],  # at most 6 of 12 each; 2 padding
        "none-seen": [slice(None), slice(0, 6), slice(0, 9), slice(0, 12)],
    }[case]
    for i, want in enumerate(expected):
        got = attention.visible_columns(mask[:, :, 3 * i : 3 * i + 3])
        assert (got == want) if isinstance(want, slice) else torch.equal(got, want), (i, got)
    rows = slice(3, None) if case == "none-seen" else slice(None)  # rows that see nothing: NaN either way

    def run(chunk: int):
        monkeypatch.setattr(attention, "QUERY_CHUNK", chunk)
        out, _ = attention.masked_attention(query, key, value, lambda s, e: mask[:, :, s:e], None)
        grads = torch.autograd.grad(out[:, rows].sum(), (query, key, value))
        return out[:, rows], grads

    (whole, whole_grads), (chunked, chunked_grads) = run(T), run(3)
    assert torch.allclose(chunked, whole, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(chunked_grads, whole_grads))


# On SmolLM2 the default run checks G-KV (the method with every scoring term); the others, which every method's
# tiny-model test (test_consistency_tiny) covers in the default run, carry the slow marker.
SMOLLM2_METHODS = [
    pytest.param(CompressionConfig.of("gkv", budget=64, window=8, interval=16, form="max"), id="gkv-max"),
    *(
        pytest.param(c, id=f"{c.method}-{c.options.get('form')}", marks=pytest.mark.slow)
        for c in [
            CompressionConfig("streaming", budget=64, window=8, interval=16),
            CompressionConfig("snapkv", budget=64, window=8, interval=16),
            CompressionConfig("h2o", budget=64, window=8, interval=16),
            CompressionConfig("rkv", budget=64, window=8, interval=16),
            CompressionConfig.of("gkv", budget=64, window=8, interval=16, form="mean"),
            CompressionConfig.of("gkv", budget=64, window=8, interval=16, form="sum"),
        ]
    ),
]


@pytest.mark.smollm2
@pytest.mark.parametrize("cfg", SMOLLM2_METHODS)
def test_consistency_smollm2(smollm2, gsm8k_questions, cfg):
    model, tokenizer = smollm2
    questions = [gsm8k_questions[i] for i in (0, 3, 7, 12)]
    out = RolloutEngine(model, tokenizer, cfg).generate(
        questions, SamplingConfig(max_new_tokens=48, temperature=1.0, seed=0, ignore_eos=True)
    )
    assert len(set(out.prompt_lengths.tolist())) > 1
    check(model, out, cfg)


@pytest.mark.parametrize("method", [pytest.param("full", marks=pytest.mark.slow), "gkv"])  # gkv: the compressing step
def test_compiled_decode_matches_eager_and_trainer(tiny_llama, method):
    """compile_decode (static-shape step under torch.compile) samples the eager step's tokens and records, its
    log-probs agree to float rounding, and the trainer reproduces them; rows finish early, so the batch narrows
    (a recompile with a dynamic batch) and the attention width grows past one static width step. With prefixes,
    their tokens go through in eager forwards of several between compiled steps: the same rollout."""
    cfg = CompressionConfig(method, budget=16, window=4, interval=8)
    prompts = random_prompts([5, 17, 40, 9])
    runs = [
        RolloutEngine(tiny_llama, compression=cfg).generate(
            prompts,
            SamplingConfig(max_new_tokens=40, temperature=1.0, num_samples=2, stop_token_ids=(2,), compile_decode=c),
        )
        for c in (False, True)
    ]
    eager, compiled = runs
    assert (compiled.completion_lengths < 40).sum() >= 2  # rows left the batch
    assert torch.equal(eager.sequences, compiled.sequences)
    assert (eager.logprobs - compiled.logprobs).abs().max() <= 1e-5
    if method == "full":
        assert compiled.record is None
        assert consistency_report(tiny_llama, compiled)["max_abs_logprob_diff"] <= TOL
    else:
        assert torch.equal(eager.record.evict_at, compiled.record.evict_at)
        check(tiny_llama, compiled, cfg)
    # given tokens: eager forwards of several tokens between the compiled steps give the eager rollout (chunked as
    # well: chunks against one token per forward are compared in fp64 in test_generation)
    prefixes = random_prompts([23, 30, 12, 19], seed=9)
    eager, compiled = (
        RolloutEngine(tiny_llama, compression=cfg).generate(
            prompts,
            SamplingConfig(max_new_tokens=40, num_samples=2, stop_token_ids=(2,), compile_decode=c),
            prefixes=prefixes,
        )
        for c in (False, True)
    )
    assert compiled.stats["forwards"] == eager.stats["forwards"] < eager.stats["steps"] - 1
    assert torch.equal(eager.sequences, compiled.sequences)
    assert (eager.logprobs - compiled.logprobs).abs().max() <= 1e-5
    assert method == "full" or torch.equal(eager.record.evict_at, compiled.record.evict_at)


def test_decode_one_token_is_one_graph():
    """compile_decode compiles ``decode_one_token`` with fullgraph=True: the default test above passes only if
    the step is one graph; this control (a hook that breaks the graph inside the model) must fail, naming it."""
    model = tiny_model("tiny-llama")
    model.model.layers[1].register_forward_pre_hook(lambda module, args: torch._dynamo.graph_break())
    cfg = CompressionConfig("gkv", budget=16, window=4, interval=8)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="graph_break"):
        RolloutEngine(model, compression=cfg).generate(
            random_prompts([5]), SamplingConfig(max_new_tokens=3, compile_decode=True)
        )


def test_compiled_decode_refuses_s4r(tiny_llama):
    cfg = CompressionConfig("s4r", budget=16, window=4, interval=8)
    with pytest.raises(ValueError, match="no static decode step"):
        RolloutEngine(tiny_llama, compression=cfg).generate(
            random_prompts([5]), SamplingConfig(max_new_tokens=4, compile_decode=True)
        )


@pytest.mark.slow  # the compiled step's fp32 equality is in the default run; this is its bf16 variant
def test_compiled_decode_under_bf16_autocast(tiny_llama):
    """precision=bf16 rolls out fp32 weights under bf16 autocast: the static step writes bf16 states into the
    fp32 buffers (a dtype mismatch failed the first decode step)."""
    cfg = CompressionConfig("gkv", budget=16, window=4, interval=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = RolloutEngine(tiny_llama, compression=cfg).generate(
            random_prompts([5, 30]), SamplingConfig(max_new_tokens=20, compile_decode=True)
        )
    assert out.stats["compressions"] >= 2 and (out.completion_lengths == 20).all()


def test_chunked_masked_attention_keeps_its_dropout_through_the_recompute(monkeypatch):
    """``masked_attention`` with dropout: each chunk recomputed in the backward draws the same dropout as its
    forward did, so output and gradients equal those of the same chunks run without recomputation (the seed set
    alike); a recompute with fresh randomness would change the gradients."""
    torch.manual_seed(0)
    B, H, Hkv, Q, D = 2, 4, 2, 12, 8
    q, k, v = (torch.randn(B, h, Q, D, requires_grad=True) for h in (H, Hkv, Hkv))
    mask = (torch.rand(B, Hkv, Q, Q) > 0.3) | torch.eye(Q, dtype=torch.bool)
    monkeypatch.setattr(attention, "QUERY_CHUNK", 5)

    def run(attend):
        torch.manual_seed(1)
        out = attend()
        out.sum().backward()
        grads = [t.grad.clone() for t in (q, k, v)]
        for t in (q, k, v):
            t.grad = None
        return out.detach(), grads

    chunked, grads = run(lambda: attention.masked_attention(q, k, v, lambda s, e: mask[:, :, s:e], None, 0.5)[0])
    plain, plain_grads = run(
        lambda: torch.cat(
            [
                attention.sdpa_with_head_mask(q[:, :, s : s + 5], k, v, mask[:, :, s : s + 5], None, 0.5)[0]
                for s in range(0, Q, 5)
            ],
            dim=1,
        )
    )
    assert torch.equal(chunked, plain) and all(torch.equal(a, b) for a, b in zip(grads, plain_grads))


GIVEN_METHODS = [
    CompressionConfig("full"),
    *tiny_methods(64, 8, 16, 14),
    CompressionConfig.of("s4r", eta=0.3, window=4, sinks=2),
]


@pytest.mark.parametrize("cfg", GIVEN_METHODS, ids=lambda c: f"{c.method}-{c.options.get('form')}")
def test_sampled_tokens_after_a_long_given_beginning_match_the_rollout(tiny_llama, cfg):
    """A completion that begins with 520 given tokens (long_recall's story, fed through the compressing cache, up
    to each compression point in one forward) then samples: for every method the trainer's log-probs under the
    record equal the rollout's, of the sampled tokens and of the given ones (reported too: TRL reads them); a plain
    causal mask and the record rotated by one layer do not (the full cache: no record, the plain causal mask is its
    own)."""
    method = cfg.method
    given = random_prompts([520, 530], seed=11)
    out = RolloutEngine(tiny_llama, compression=cfg).generate(
        random_prompts([9, 14]),
        SamplingConfig(max_new_tokens=572, temperature=1.0, seed=2, stop_token_ids=()),
        prefixes=given,
    )
    assert method in ("full", "s4r") or out.stats["compressions"] >= 30
    assert out.stats["forwards"] < 100 or method in ("s4r", "tova")  # the given tokens went through in chunks
    sampled = out.completion_mask.clone()
    for row, prefix in enumerate(given):
        sampled[row, : len(prefix)] = False  # the given tokens: not the policy's samples
    assert int(sampled.sum()) == 2 * 572 - 520 - 530

    def diff(record, tokens):
        with torch.no_grad():
            lp = token_logprobs(tiny_llama, out.sequences, out.attention_mask, out.num_completion_tokens, record)
        return (lp - out.logprobs)[tokens].abs().max().item()

    given_tokens = out.completion_mask.bool() & ~sampled
    if method == "full":
        assert out.record is None and diff(None, sampled) <= TOL and diff(None, given_tokens) <= TOL
        return
    assert diff(out.record, sampled) <= TOL and diff(out.record, given_tokens) <= TOL
    assert diff(None, sampled) > 1e-2
    # (streaming evicts the same tokens in every layer and head: rotating layers changes nothing)
    assert method == "streaming" or diff(out.record.roll_layers(1), sampled) > 1e-2


def random_eviction_record(lengths: list[int], layers: int, heads: int, width: int, seed: int) -> torch.Tensor:
    """int32 [B, layers, heads, width]: each key evicted at a random later position, or (a third of them) never."""

    g = torch.Generator().manual_seed(seed)
    keys = torch.arange(width)
    stamps = keys + 1 + torch.randint(0, max(lengths), (len(lengths), layers, heads, width), generator=g)
    never = torch.rand(len(lengths), layers, heads, width, generator=g) < 0.3
    return torch.where(never, NEVER, stamps).to(torch.int32)


@pytest.mark.parametrize("queries", ["all", "last"])
def test_block_masks_from_the_record_equal_create_block_mask(tiny_llama, queries):
    """The record's BlockMask (full and partial tiles from block summaries) equals the one create_block_mask builds by
    evaluating the mask everywhere: random records over batches padded on either side, and real rollout records of
    every eviction method (several 128-token blocks, rows of different lengths)."""
    from torch.nn.attention.flex_attention import create_block_mask

    from gkv_rollout.contract.eviction import EvictionMasks, block_sets

    def compare(masks, layers, heads, num_queries):
        B, T = masks.positions.shape
        for layer in range(layers):
            ours = masks.layer_block_mask(layer, heads, num_queries)
            theirs = create_block_mask(masks.layer_mask_mod(layer, heads, num_queries), B, heads, num_queries, T)
            assert block_sets(ours) == block_sets(theirs), (layer, heads, num_queries)

    width = 520
    attention = torch.zeros(3, width, dtype=torch.long)
    for row, (left, right) in enumerate([(0, 0), (131, 5), (3, 260)]):
        attention[row, left : width - right] = 1
    lengths = attention.sum(-1).tolist()
    record = random_eviction_record(lengths, 2, 2, width, seed=5)
    compare(EvictionMasks.build(record, attention, "flex"), 2, 6, width if queries == "all" else 200)

    for cfg in tiny_methods(64, 8, 16, 140):
        out = RolloutEngine(tiny_llama, compression=cfg).generate(
            random_prompts([9, 140]), SamplingConfig(max_new_tokens=300, temperature=1.0, seed=4)
        )
        masks = out.record.attention_context(tiny_llama, out.attention_mask, "flex")
        num_queries = out.sequences.shape[1] if queries == "all" else out.num_completion_tokens
        config = tiny_llama.config
        compare(masks, config.num_hidden_layers, config.num_attention_heads, num_queries)


@pytest.mark.parametrize("method", ["gkv", "snapkv", "streaming", "random_attention"])
def test_flex_backend_from_the_record_over_several_blocks(tiny_llama, method):
    """FlexAttention under the record's block masks over several 128-token blocks: the trainer's log-probs equal the
    rollout's; a causal mask and the record rotated by one layer do not (random_attention: a kept prompt whose
    first key block every query sees, the last query block ragged)."""
    # a new shape compiles FlexAttention's CPU kernel again for that shape: torch 2.13's kernel for dynamic shapes
    # (what a second shape asks for by default) does not compile (a C++ error in its generated code)
    cfg = CompressionConfig(method, budget=method_budget(method, 64, 8, 140), window=8, interval=16)
    out = RolloutEngine(tiny_llama, compression=cfg).generate(
        random_prompts([9, 140]), SamplingConfig(max_new_tokens=300, temperature=1.0, seed=6, stop_token_ids=())
    )
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
        report = consistency_report(tiny_llama, out, backend="flex")
    assert report["max_abs_logprob_diff"] <= TOL and report["causal_mask_diff"] > 1e-2
    assert method == "streaming" or report["rotated_layers_diff"] > 1e-2


def test_compressions_inside_compiled_decode_compile_nothing_more(tiny_llama):
    """G-KV under compile_decode: past its first compression the cache holds a fixed number of slots, so ten more
    compressions compile nothing (a rollout with 22 compressions compiles as many graphs as one with 12; counted
    by dynamo; a control: a batch of another width does compile more), and the compiled rollout's tokens,
    log-probs and record equal the eager one's."""
    from torch._dynamo.utils import counters

    cfg = CompressionConfig("gkv", budget=32, window=4, interval=8)
    prompts = random_prompts([12, 20])

    def rollout(new_tokens: int, compiled: bool):
        torch._dynamo.reset()
        counters.clear()
        sampling = SamplingConfig(
            max_new_tokens=new_tokens, temperature=1.0, seed=3, stop_token_ids=(), compile_decode=compiled
        )
        out = RolloutEngine(tiny_llama, compression=cfg).generate(prompts, sampling)
        return out, counters["stats"]["unique_graphs"] if compiled else None

    short, short_frames = rollout(120, True)
    long, long_frames = rollout(200, True)
    assert long.stats["compressions"] - short.stats["compressions"] >= 10 and short.stats["compressions"] >= 10
    assert long_frames == short_frames > 0
    # control: the count sees a recompilation where shapes do change (a third sequence, in the same process)
    sampling = SamplingConfig(max_new_tokens=40, temperature=1.0, seed=3, stop_token_ids=(), compile_decode=True)
    RolloutEngine(tiny_llama, compression=cfg).generate(random_prompts([12, 20, 16]), sampling)
    assert counters["stats"]["unique_graphs"] > long_frames
    eager, _ = rollout(200, False)
    assert torch.equal(eager.sequences, long.sequences) and torch.equal(eager.record.evict_at, long.record.evict_at)
    assert (eager.logprobs - long.logprobs).abs().max() <= 1e-5


CHECK_REFUSALS = [  # gkv-train check's arguments, each refused before the model loads (the model has no weights)
    ("--batch 0", "--batch must be at least 1, got 0"),
    ("--max-new-tokens 0", "--max-new-tokens must be at least 1, got 0"),
    ("--max-new-tokens 100000000", "--max-new-tokens=100000000 does not fit"),
    ("--temperature -1", "--temperature must be a finite number > 0"),
    ("--temperature nan", "--temperature must be a finite number > 0 (log-probs of logits / temperature), got nan"),
    ("--temperature 0", "--temperature must be a finite number > 0"),
    ("--seed -1", "--seed must be an integer in [0, 2**63 - 1]"),
    ("--seed 100000000000000000000000", "--seed must be an integer in [0, 2**63 - 1]"),
    ("--batch 1000 --max-new-tokens 3000", "attend with a dense mask: about"),
]


def test_check_refuses_its_arguments_before_the_model_loads(weightless_model, tmp_path):
    """``gkv-train check`` (scripts/check_consistency.py) checks every argument before the model loads: one line,
    exit 2. Before, --batch 0 and --temperature -1 failed with tracebacks after the model loaded, --temperature nan
    reported an inconsistency, --max-new-tokens 10**8 allocated 12.8 GB. Control: a sound check of the tiny model
    runs and is consistent."""
    from entry_points import run_each

    root = Path(__file__).resolve().parents[1]
    argvs = [["--model", weightless_model, *flags.split()] for flags, _ in CHECK_REFUSALS]
    argvs.append(["--model", "tiny", "--batch", "2", "--max-new-tokens", "12"])
    *refused, sound = run_each(root / "scripts" / "check_consistency.py", argvs, cwd=tmp_path)
    for (flags, message), proc in zip(CHECK_REFUSALS, refused):
        line = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (flags, proc.stderr[-2000:])
        assert line.startswith("gkv-train check: error: ") and message in line, (flags, line)
    assert sound.returncode == 0, sound.stderr[-2000:]
    assert json.loads(sound.stdout.strip().splitlines()[-1])["consistent"] is True
