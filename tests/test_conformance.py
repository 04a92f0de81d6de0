"""The eviction methods keep the same tokens as the reference implementation (microsoft/G-KV at 6db3b2e).

``tests/fixtures/gkv_reference.pt`` holds small synthetic states (2 layers, GQA 6/2 heads, a left-padded batch
of two prompts longer than the budget, 33 generated tokens: 5 compressions with history carried) and the
kept logical positions that the reference's own ``update_kv`` produced for each method, compression, layer,
sequence and KV head (``scripts/reference/make_fixtures.py`` regenerates it from a reference checkout).

Here the same states go through the project's ``EvictionCache`` (prefill, then one token at a time, with the
compressions it triggers itself), configured with the method name and the sizes only: every other setting
is the project's default. Kept sets must be equal; where the reference had a tie at its top-k boundary, the
two may break it differently, and then (only then) the difference must lie within the tied scores, and
later compressions of that (layer, sequence, head) are no longer comparable.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from gkv_rollout.config import CompressionConfig
from gkv_rollout.contract.record import logical_positions
from gkv_rollout.eviction_cache import EvictionCache

FIXTURE = torch.load(Path(__file__).parent / "fixtures" / "gkv_reference.pt", weights_only=False)


class RecordingMethod:
    """Wraps a cache's method to keep each layer's (score, candidates) of every compression."""

    def __init__(self, method):
        self.method, self.calls = method, []

    def __getattr__(self, name):  # the method's options (budget, window, ...)
        return getattr(self.method, name)

    def score(self, state):
        score, history = self.method.score(state)
        self.calls.append((score.clone(), state.candidates.clone(), state.key_pos.clone()))
        return score, history


def run_project(cfg: CompressionConfig):
    """Feed the fixture's states through a EvictionCache; returns per compression (generated tokens,
    kept positions per (layer, sequence, head) as sets, {(layer, b, h): {position: score}}) and the cache."""
    queries, keys = FIXTURE["queries"], FIXTURE["keys"]  # [L, B, H, T, D], [L, B, Hkv, T, D]
    L, B, H, T, D = queries.shape
    Hkv = keys.shape[2]
    prompts = FIXTURE["prompt_lengths"]
    P = max(prompts)
    model_config = SimpleNamespace(
        num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=Hkv, head_dim=D, hidden_size=H * D
    )
    new = FIXTURE["new_tokens"]
    cache = EvictionCache(model_config, cfg.resolved, B, P + new, P + new, torch.float32, torch.device("cpu"))
    recorder = cache.method = RecordingMethod(cache.method)
    modules = [SimpleNamespace(layer_idx=layer, num_key_value_groups=H // Hkv, is_causal=True) for layer in range(L)]
    prompt_mask = torch.arange(P)[None, :] >= torch.tensor([P - p for p in prompts])[:, None]
    results = []

    def forward(start, end, positions, valid):
        mask = cache.begin(positions, valid)
        for layer, module in enumerate(modules):
            q, k = queries[layer, :, :, start:end], keys[layer, :, :, start:end]
            cache.attend(module, q, k, torch.zeros_like(k), mask)
        cache.end()

    def snapshot(step, before):
        if cache.compressions == before:
            return
        used = cache.used
        kept = {}
        for layer in range(L):
            for b in range(B):
                ok = cache.valid[b, :used]
                for h in range(Hkv):
                    kept[layer, b, h] = set(cache.positions[layer, b, h, :used][ok].tolist())
        scores = {}
        for layer, (score, candidates, key_pos) in enumerate(recorder.calls[-L:]):
            for b in range(B):
                for h in range(Hkv):
                    c = candidates[b, h]
                    scores[layer, b, h] = dict(zip(key_pos[b, h][c].tolist(), score[b, h][c].tolist()))
        results.append((step, kept, scores))

    forward(0, P, logical_positions(prompt_mask.long()), prompt_mask)
    before = cache.compressions
    cache.after_prefill()
    snapshot(0, before)
    for step in range(1, new):
        t = P + step - 1
        forward(t, t + 1, torch.tensor([[p + step - 1] for p in prompts]), torch.ones(B, 1, dtype=torch.bool))
        before = cache.compressions
        cache.after_step(step)
        snapshot(step, before)
    return results, cache


@pytest.mark.parametrize("name", list(FIXTURE["cases"]))
def test_kept_sets_equal_the_reference(name):
    case = FIXTURE["cases"][name]
    results, cache = run_project(CompressionConfig.of(**case["project"]))
    assert [step for step, _, _ in results] == case["steps"], "compressions at different steps"
    compared = exact = 0
    diverged = set()
    for c, (step, kept, scores) in enumerate(results):
        reference = case["kept"][c]  # [L, B, Hkv, budget] logical positions
        for (layer, b, h), ours in kept.items():
            if (layer, b, h) in diverged:
                continue
            theirs = set(reference[layer, b, h].tolist())
            compared += 1
            if ours == theirs:
                exact += 1
                continue
            # Only a tie at the reference's top-k boundary may be broken differently.
            assert case["ties"][c][layer, b, h], (
                f"{name}: compression {c} layer {layer} seq {b} head {h} differs without a tie"
            )
            s = scores[layer, b, h]
            boundary = min(s[p] for p in ours if p in s)
            for p in ours ^ theirs:
                assert abs(s[p] - boundary) <= 1e-5 * max(abs(v) for v in s.values()), (name, c, p, s[p], boundary)
            diverged.add((layer, b, h))
    assert compared >= len(results[0][1])  # every (layer, sequence, head) compared at least once
    if not any(t.any() for t in case["ties"]):
        assert exact == compared, f"{name}: {exact}/{compared} kept sets equal"
    # ties are broken by the same topk call as the reference's, so with this torch they agree too
    assert exact >= 0.9 * compared, f"{name}: {exact}/{compared} kept sets equal"
    # the record says the same as the cache: after the last compression, exactly its kept set is visible
    step, kept, _ = results[-1]
    for b, prompt in enumerate(FIXTURE["prompt_lengths"]):
        stamp = prompt + step
        for (layer, bb, h), ours in kept.items():
            if bb == b:
                visible = (cache.evict_at[layer, b, h, :stamp] > stamp).nonzero().flatten().tolist()
                assert set(visible) == ours


def test_conformance_fixture_exercises_the_hard_parts():
    """The fixture must cover what the methods disagreed on: GQA groups, history over several compressions,
    left padding, near-duplicate keys above the redundancy threshold."""
    queries, keys = FIXTURE["queries"], FIXTURE["keys"]
    assert queries.shape[2] // keys.shape[2] > 1
    assert len(set(FIXTURE["prompt_lengths"])) > 1
    assert all(len(case["steps"]) >= 4 for case in FIXTURE["cases"].values())
    unit = torch.nn.functional.normalize(keys, dim=-1)
    cos = unit @ unit.transpose(-1, -2)
    assert (cos > 0.5).float().mean() > 0.05
    assert FIXTURE["redundancy_kernel"] == "triton-interpreter"


@pytest.mark.parametrize(
    "name, departure",
    [
        ("gkv", dict(similarity="mean_cosine")),
        ("gkv", dict(group_agg="mean")),
        ("rkv", dict(lambda_=0.5)),
        ("gkv-mean", dict(form="max")),
        ("snapkv", dict(pool_kernel=7)),
        ("h2o", dict(window=4)),
    ],
)
def test_control_departing_options_do_not_match(name, departure):
    """Control: the check bites. An option that departs from the reference changes most kept sets."""
    case = FIXTURE["cases"][name]
    results, _ = run_project(CompressionConfig.of(**{**case["project"], **departure}))
    pairs = [(kept[k], set(case["kept"][c][k].tolist())) for c, (_, kept, _) in enumerate(results) for k in kept]
    assert sum(a == b for a, b in pairs) < 0.5 * len(pairs)


def test_select_keep_with_a_sequence_shorter_than_the_window():
    """A left-padded sequence with fewer tokens than the window keeps all of them; its batch-mate keeps its
    window and its best candidates."""
    from gkv_rollout.scoring import candidate_slots, select_keep

    S, W, budget = 12, 4, 6
    key_ok = torch.ones(2, S, dtype=torch.bool)
    key_ok[1, :9] = False  # three tokens, in the last slots
    lengths = torch.tensor([S, 3])
    key_pos = torch.stack([torch.arange(S), torch.arange(S) - 9]).clamp_min(0)[:, None, :]
    score = torch.tensor([[5.0, 1, 7, 2, 9, 0, 3, 4, 8, 6, 1, 1], [0.0] * 12])[:, None, :]
    candidates = candidate_slots(key_pos, key_ok, lengths, W, 0)
    index, n_keep = select_keep(score, candidates, key_ok, budget, W)
    kept = [set(index[b, 0, index.shape[-1] - int(n_keep[b]) :].tolist()) for b in range(2)]
    assert kept[0] == {4, 2} | {8, 9, 10, 11} and kept[1] == {9, 10, 11}


def test_similarity_sums_follow_their_definition():
    """The vectorised ``rkv`` similarity sums against a loop over the definition: cosines to the other occupied
    keys, each key's most recent near-duplicate (cos > 0.5) not counted against that duplicate."""
    from gkv_rollout.scoring import similarity_sums

    g = torch.Generator().manual_seed(0)
    base = torch.randn(2, 2, 1, 8, generator=g)
    keys = base + 0.7 * torch.randn(2, 2, 12, 8, generator=g)  # many pairs above the threshold, some below
    ok = torch.rand(2, 12, generator=g) > 0.2
    got = similarity_sums(keys, ok, "rkv")
    unit = keys / (keys.norm(dim=-1, keepdim=True) + 1e-6)
    for b in range(2):
        for h in range(2):
            cos = [
                [float(unit[b, h, m] @ unit[b, h, n]) if m != n and ok[b, m] and ok[b, n] else 0.0 for n in range(12)]
                for m in range(12)
            ]
            latest = [max((m for m in range(12) if cos[m][n] > 0.5), default=-1) for n in range(12)]
            for m in range(12):
                want = sum(cos[m][n] for n in range(12) if latest[n] != m)
                assert abs(float(got[b, h, m]) - want) < 1e-5, (b, h, m)
    assert any(v >= 0 for v in latest) and any(v < 0 for v in latest)  # both cases occurred


@pytest.mark.parametrize("chunk", [1, 1000, 3000], ids=["one-each", "two-each", "uneven"])
def test_scores_computed_in_chunks_equal_one_call(monkeypatch, chunk):
    """The window attention and the key similarities run a few sequences (heads) at a time (``SCORE_CHUNK``
    entries of their S x S work): bit for bit what one call over the batch gives, with empty slots, an empty
    sequence, invalid scoring queries and keys sliced from a wider buffer (as the cache passes them)."""
    from gkv_rollout import scoring

    g = torch.Generator().manual_seed(3)
    B, Hkv, G, W, S, D = 5, 2, 3, 4, 20, 8
    keys = (torch.randn(B, Hkv, 1, D, generator=g) + torch.randn(B, Hkv, S + 6, D, generator=g))[:, :, :S]
    key_ok = torch.rand(B, S, generator=g) > 0.2
    key_ok[2] = False
    query = torch.randn(B, Hkv, G, W, D, generator=g)
    key_pos = torch.randint(0, 30, (B, Hkv, S), generator=g)
    query_pos = torch.randint(10, 30, (B, W), generator=g)
    query_ok = torch.rand(B, W, generator=g) > 0.3
    query_ok[2] = False  # the empty sequence has no scoring queries either

    def scores():
        attention = [
            scoring.window_attention(query, query_pos, query_ok, keys, key_pos, key_ok, D**-0.5, agg)
            for agg in ("max", "mean")
        ]
        return [scoring.similarity_sums(keys, key_ok, "rkv"), scoring.key_redundancy(keys, key_ok, "rkv"), *attention]

    whole = scores()
    monkeypatch.setattr(scoring, "SCORE_CHUNK", chunk)
    chunked = scores()
    assert all(torch.equal(a, b) for a, b in zip(whole, chunked))
    assert whole[0].abs().sum() > 0 and whole[2].abs().sum() > 0


def test_the_end_to_end_comparison_builds_every_reference_recipe():
    """scripts/compare_reference.py's recipes are valid configurations with the reference's values (the script
    builds them before any work; a recipe the configuration refuses would stop it)."""
    import importlib.util
    import sys

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "scripts"))  # its _common helper
    try:
        spec = importlib.util.spec_from_file_location("compare_reference", root / "scripts" / "compare_reference.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(root / "scripts"))
    configs = {name: module.project_config(name, 128, 16, 32).resolved for name in module.METHODS}
    assert configs["rkv"].lambda_ == 0.1 and configs["h2o"].window == 1
    assert [configs[f"gkv-{form}"].form for form in ("max", "mean", "sum")] == ["max", "mean", "sum"]
