"""scripts/compare_random_attention.py as main (small settings): ``random_attention`` keeps what the authors' rule keeps
given the same draws, at the same steps where their cadence meets the project's, and draws by the same law; the
control (``random``, no prompt kept) disagrees on every count, and the law checks fail on draws that break the law."""

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--budget", "32", "--window", "8", "--interval", "8", "--prompts", "8", "16", "5", "12"]
SMALL += ["--completion", "80", "--prompt", "8", "--rows", "8", "--seeds", "1"]


def compare(*extra: str) -> dict:
    command = [sys.executable, str(ROOT / "scripts" / "compare_random_attention.py"), *SMALL, *extra]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_random_attention_keeps_what_the_authors_rule_keeps():
    result = compare()
    assert result["law"]["agreement"] == 1.0 and result["law"]["compared"] > 200
    for row in result["cadence"]:
        aligned = row["prompt"] % 8 == 0  # the cache's length meets the generated count's multiples of 8
        assert row["same_steps"] is aligned and row["law_same_steps"], row
        assert (row["equal"] == row["compared"]) if aligned else row["equal"] == 0, row
    dist = result["distribution"]
    for side in ("project", "reference"):
        found = dist[side]
        assert found["prompt_always_kept"] and found["budget_always_kept"], side
        assert found["p_uniform"] > 0.01, (side, found)
        for pair in ("overlap_heads", "overlap_layers"):
            assert abs(found[pair] - dist["independent_overlap"]) < 1.5, (side, pair, found)
    control = compare("--method", "random")  # the prompt not kept: the same checks must fail
    assert control["law"]["agreement"] < 0.1
    assert not control["distribution"]["project"]["prompt_always_kept"]
    assert control["distribution"]["project"]["p_uniform"] < 1e-6


def test_the_law_checks_fail_on_draws_that_break_the_law():
    """Draws shared by two KV heads keep the same tokens in both (the overlap is every kept candidate, not an
    independent draw's); draws that are a function of the position alone, the same at every compression, keep
    the same tokens at every compression (the chi-square test refuses them)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from compare_random_attention import first_overlaps, law_statistics, reference_kept

    prompt, budget, window, forwarded = 8, 32, 8, 79

    def run(draw):
        found = reference_kept(prompt, forwarded, budget, window, window, draw, "project")
        return [found[s] for s in sorted(found)]

    g = torch.Generator().manual_seed(0)
    fresh = lambda time, positions: torch.rand(len(positions), generator=g)  # noqa: E731
    samples = [run(fresh) for _ in range(64)]
    law = law_statistics(samples, prompt, budget, window)
    assert law["prompt_always_kept"] and law["budget_always_kept"] and law["p_uniform"] > 0.01
    pairs = [(i, i + 1) for i in range(0, 64, 2)]
    independent = first_overlaps(samples, pairs, prompt, window)

    shared = []
    for _ in range(32):  # two heads with one draw: each pair of samples from the same generator state
        state = g.get_state()
        shared.append(run(fresh))
        g.set_state(state)
        shared.append(run(fresh))
    assert first_overlaps(shared, pairs, prompt, window) == budget - window - prompt > independent + 3

    by_position = lambda time, positions: (positions * 0.6180339887).frac()  # noqa: E731
    frozen = [run(by_position) for _ in range(64)]
    assert law_statistics(frozen, prompt, budget, window)["p_uniform"] < 1e-6
