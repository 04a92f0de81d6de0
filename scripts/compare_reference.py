"""End-to-end conformance of the rollout engine's G-KV family with the authors' reference code (G-KV 6db3b2e).

The same token ids are teacher-forced through the project's ``RolloutEngine.replay`` and through the
reference's own generation loop (``scripts/reference/reference_generation.py``, run by ``--reference-python``
in a separate virtualenv with transformers 4.51.1), on SmolLM2-135M in fp32, batch size 1. After every
compression at which the sequence exceeded the budget (the reference's ``update_kv`` is a no-op otherwise),
the kept logical positions are compared for every layer and KV head:

* reference: ``pos_ids_cache[layer]`` right after the compressing forward (step = tokens in the sequence);
* project: from ``out.record`` (``evict_at`` int32 [N, L, Hkv, T]): key k is in the cache right after the
  compression stamped t iff k < t and evict_at[k] > t.

Cases: GSM8K test questions (``--questions``; the default 0,1,4,8 has prompts of 107, 67, 151 and 146 tokens,
so two are compressed right after prefill) in the project's prompt template and chat template; completions
sampled once with the project's engine, full cache, T 0.6, seed 0, ``ignore_eos``, ``--max-new-tokens`` (512),
stored in ``--cases`` (reused when it exists, so both sides and later runs see the same ids).

Method settings (the project's CompressionConfig, fields passed explicitly, vs the reference recipe of its
``scripts/inference.sh``):
    streaming  sinks 4, budget B                    streamingllm, sink_len 4, window_size B - 4
    snapkv     pool_kernel 5                        score + enable_pooling (kernel_size 5)
    rkv        pool_kernel 5, lambda 0.1            score + enable_pooling + suppressing_redundancy, mix_lambda 0.1
    h2o        window 1, alpha 0.8                  score + enable_score_cache, smooth_method sum, window_size 1
    gkv-F      alpha 0.8, lambda 0.5, pool_kernel 1, redundancy, form F (max/mean/sum)
               score + suppressing_redundancy, mix_lambda 0.5, enable_score_cache, alpha 0.8, smooth_method F
budget ``--budget`` (128), window ``--window`` (16; h2o 1), interval ``--interval`` (one or more values).

Prints one JSON line (also added to ``--output`` as its run ``--run``): per interval and method, the exact-match
rate of the kept sets over (compression, layer, KV head), their mean Jaccard index, the compressions compared,
whether both sides compressed at the same steps, the first mismatch, and the max |log-prob difference| of the
forced tokens (temperature 1) under the compressed caches; plus a check that the two models agree with a full
cache.

    .venv/bin/python scripts/compare_reference.py --interval 32 128 --threads 1 --output results/reference_e2e.json \
        --run after

``--output`` is the comparison's one results file (``{"script": "compare_reference", "runs": {run: result}}``):
every tree compared, by run name; a run of the same name replaced; a file that is not one refused before any work.

Both sides decode one token at a time on the CPU (~60 tok/s each on an idle 2-core machine, 5-10x slower when it
is shared): ``--select``, ``--max-cases`` and ``--max-completion`` make a shorter check, ``--project-batch``
replays the cases in one left-padded batch, ``--reuse-reference`` skips the reference run when its file exists
(checked against the cases' token ids), and ``--project-root`` tests another tree (e.g. ``git archive`` of an
older commit) with the same reference.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _project_root(argv) -> Path:
    """``--project-root``: the tree whose ``rollout``/``gkv_train`` are tested (default: this checkout)."""
    for i, a in enumerate(argv):
        if a == "--project-root" and i + 1 < len(argv):
            return Path(argv[i + 1]).resolve()
        if a.startswith("--project-root="):
            return Path(a.split("=", 1)[1]).resolve()
    return ROOT


_tree = _project_root(sys.argv[1:])  # this layout: the three distributions' folders; an older one: its root
_split = (_tree / "rollout" / "gkv_rollout").is_dir()
sys.path[:0] = [str(_tree / "rollout"), str(_tree / "rewards"), str(_tree)] if _split else [str(_tree)]

from gkv_train.models import load_model  # noqa: E402

# The tree's layout decides the imports (by its files: an installed editable finder could otherwise resolve a
# module this tree lacks from another checkout): three distributions with gkv_train grouped by concern (this one),
# three distributions with a flat gkv_train (e.g. 1202b97), or the single-package layout (e.g. f27a70f).
if _split:
    from gkv_rollout.config import CompressionConfig, SamplingConfig
    from gkv_rollout.contract.eviction import NEVER
    from gkv_rollout.engine import RolloutEngine, encode_prompts

    if (_tree / "gkv_train" / "problems" / "data.py").is_file():
        from gkv_train.problems.data import PROMPT_TEMPLATE
    else:
        from gkv_train.data import PROMPT_TEMPLATE
else:
    from rollout.config import CompressionConfig, SamplingConfig
    from rollout.engine import RolloutEngine, encode_prompts

    from gkv_train.config import PROMPT_TEMPLATE
    from gkv_train.record import NEVER

METHODS = ("streaming", "snapkv", "rkv", "h2o", "gkv-max", "gkv-mean", "gkv-sum")
REFERENCE_SCRIPT = ROOT / "scripts" / "reference" / "reference_generation.py"


def project_config(name: str, budget: int, window: int, interval: int) -> CompressionConfig:
    """The project's CompressionConfig equal to the reference recipe ``name`` (see the module docstring)."""
    common = dict(budget=budget, window=window, interval=interval)
    # flat option names: CompressionConfig.of where the options are grouped, else the constructor (--project-root
    # may name a checkout of the flat layout)
    build = getattr(CompressionConfig, "of", CompressionConfig)
    if name == "streaming":
        return build("streaming", sinks=4, **common)
    if name == "snapkv":
        return build("snapkv", pool_kernel=5, **common)
    if name == "rkv":
        return build("rkv", pool_kernel=5, lambda_=0.1, **common)
    if name == "h2o":
        return build("h2o", alpha=0.8, **dict(common, window=1))
    if name.startswith("gkv-"):
        return build("gkv", alpha=0.8, lambda_=0.5, pool_kernel=1, redundancy=True, form=name[4:], **common)
    raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--budget", type=int, default=128)
    p.add_argument("--window", type=int, default=16)
    p.add_argument("--interval", type=int, nargs="+", default=[32])
    p.add_argument("--cases", default=str(ROOT / "results" / "reference_e2e_cases.json"))
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "gsm8k_test.jsonl"))
    p.add_argument("--questions", default="0,1,4,8", help="GSM8K test indices of the cases")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--max-cases", type=int, default=0, help="only the first N cases (0: all; for quick checks)")
    p.add_argument("--select", default="", help="comma-separated indices of the cases to use (default: all)")
    p.add_argument(
        "--max-completion",
        type=int,
        default=0,
        help="teacher-force only the first N completion tokens on both sides (0: all)",
    )
    p.add_argument(
        "--project-root",
        default=str(ROOT),
        help="tree whose rollout/ and gkv_train/ are tested (e.g. an archive of an older commit)",
    )
    p.add_argument("--project-label", default="", help="what --project-root is (e.g. its commit), for the JSON")
    p.add_argument(
        "--project-batch",
        action="store_true",
        help="replay all cases in one left-padded batch on the project side (faster; default batch 1)",
    )
    p.add_argument("--cases-only", action="store_true", help="make the case file and stop")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument(
        "--reference-python",
        default="outputs/reference/venv/bin/python",
        help="the reference's Python (scripts/reference/make_fixtures.py: how it is made)",
    )
    p.add_argument("--reference-root", default="outputs/reference/G-KV", help="checkout of microsoft/G-KV (6db3b2e)")
    p.add_argument("--reference-output", default=None, help="reference result file (default: a temp path per interval)")
    p.add_argument("--reuse-reference", action="store_true", help="use an existing --reference-output, do not rerun it")
    p.add_argument(
        "--wait-reference",
        action="store_true",
        help="with --reuse-reference: wait for a reference run started elsewhere to write its file",
    )
    p.add_argument(
        "--similarity",
        choices=("torch", "triton", "check"),
        default="torch",
        help="reference redundancy term: plain-torch equivalent, the Triton kernel (interpreter), or both",
    )
    p.add_argument("--threads", type=int, default=0, help="torch threads on both sides (0: torch's default)")
    p.add_argument("--output", type=Path, default=None, help="the results file the run is added to")
    p.add_argument("--run", default="current", help="the run's name in --output (before, after, ...)")
    args = p.parse_args(argv)
    try:
        args.before = None if args.output is None else read_runs(args.output)
    except ValueError as err:
        p.error(str(err))
    return args


def read_runs(path: Path) -> dict:
    """The results file at ``path`` (every compared tree by run name), or an empty one where there is none;
    anything else is a ValueError naming it. (Not ``gkv_train.jsonio.read_results``: this script runs on older
    trees' packages too.)"""
    if not path.exists():
        return {"script": "compare_reference", "runs": {}}
    try:
        found = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"--output {path} is not a JSON file ({err})") from None
    if not (
        isinstance(found, dict) and found.get("script") == "compare_reference" and isinstance(found.get("runs"), dict)
    ):
        raise ValueError(f"--output {path} is not compare_reference's results file (its runs by name)")
    return found


def model_dir_of(model) -> Path:
    path = Path(getattr(model, "name_or_path", "") or model.config._name_or_path)
    if not (path / "config.json").is_file() or not list(path.glob("*.safetensors")):
        raise FileNotFoundError(f"no safetensors copy of the model at {path!r}")
    return path


def make_cases(args, model, tokenizer) -> dict:
    path = Path(args.cases)
    if path.is_file():
        return json.loads(path.read_text())
    lines = Path(args.data).read_text().splitlines()
    indices = [int(i) for i in args.questions.split(",")]
    questions = [json.loads(lines[i])["question"] for i in indices]
    prompts = encode_prompts(tokenizer, [PROMPT_TEMPLATE.format(problem=q) for q in questions])
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.6, seed=0, ignore_eos=True)
    out = RolloutEngine(model, tokenizer, CompressionConfig("full")).generate(prompts, sampling)
    completions = out.completions()
    cases = {
        "source": f"{args.data} questions {indices}, PROMPT_TEMPLATE + chat template; completions from "
        f"RolloutEngine full cache, {sampling}",
        "cases": [
            {"question_index": i, "prompt": p, "completion": c} for i, p, c in zip(indices, prompts, completions)
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cases) + "\n")
    return cases


def run_reference(args, model_dir: Path, interval: int, methods: list[str], cases_path: Path) -> dict:
    out = Path(
        args.reference_output
        or Path(tempfile.gettempdir()) / f"reference_e2e_b{args.budget}_w{args.window}_i{interval}.pt"
    )
    if args.reference_output and len(args.interval) > 1:
        out = out.with_name(f"{out.stem}_i{interval}{out.suffix}")
    if args.reuse_reference and args.wait_reference:
        while True:  # another process is writing it: wait until it exists and stops growing
            if out.is_file():
                size = out.stat().st_size
                time.sleep(10)
                if out.stat().st_size == size:
                    break
            else:
                time.sleep(10)
    if not (args.reuse_reference and out.is_file()):
        cmd = [
            args.reference_python,
            str(REFERENCE_SCRIPT),
            "--reference-root",
            args.reference_root,
            "--model-dir",
            str(model_dir),
            "--cases",
            str(cases_path),
            "--output",
            str(out),
            "--methods",
            ",".join(methods),
            "--budget",
            str(args.budget),
            "--window",
            str(args.window),
            "--interval",
            str(interval),
            "--similarity",
            args.similarity,
            "--threads",
            str(args.threads),
        ]
        print("[compare] " + " ".join(cmd), file=sys.stderr, flush=True)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        subprocess.run(cmd, check=True, env=env)
    reference = torch.load(out, weights_only=False)
    cases = json.loads(cases_path.read_text())["cases"]
    digest = hashlib.sha256(json.dumps([[c["prompt"], c["completion"]] for c in cases]).encode()).hexdigest()
    if reference.get("cases_digest") != digest:
        raise RuntimeError(f"{out} was made from other token ids than {cases_path}; rerun without --reuse-reference")
    return reference


def project_description(args) -> str:
    if args.project_label:
        return args.project_label
    root = Path(args.project_root)
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "rollout", "gkv_train"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return f"{root} at {head}" + (" (rollout/gkv_train modified)" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return str(root)


def kept_sets_project(evict_at: torch.Tensor, stamp: int) -> torch.Tensor:
    """evict_at int32 [L, Hkv, T] -> bool [L, Hkv, stamp]: in the cache right after the compression at ``stamp``."""
    return evict_at[..., :stamp] > stamp


def expected_steps(P: int, C: int, budget: int, interval: int) -> list[int]:
    """Steps at which a sequence over the budget is compressed (prefill; the forward of every interval-th
    generated token, of which only tokens 1 .. C-1 are fed)."""
    steps = [P] if P > budget else []
    return steps + [P + n for n in range(interval, C, interval) if P + n > budget]


@torch.no_grad()
def model_check(model, cases: list[dict], reference: dict) -> dict:
    seq_diff = last_diff = 0.0
    for case, ref in zip(cases, reference["model_check"]):
        ids = torch.tensor([case["prompt"] + case["completion"]], dtype=torch.long)
        lp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits.float()[0], dim=-1)
        P = len(case["prompt"])
        seq = lp[:-1].gather(-1, ids[0, 1:, None])[:, 0]
        seq_diff = max(seq_diff, (seq - ref["sequence_logprobs"]).abs().max().item())
        last_diff = max(last_diff, (lp[P - 1] - ref["last_prompt_logprobs"]).abs().max().item())
    return {
        "sequence_logprob_max_abs_diff": seq_diff,
        "last_prompt_logprobs_max_abs_diff": last_diff,
        "ok": max(seq_diff, last_diff) <= 1e-4,
    }


def replay_project(model, tokenizer, name: str, args, interval: int, cases: list[dict]) -> dict:
    """The project's record and forced-token log-probs (temperature 1) of every case under method ``name``."""
    engine = RolloutEngine(model, tokenizer, project_config(name, args.budget, args.window, interval))
    t0 = time.perf_counter()
    if args.project_batch:  # left-padded: logical positions unchanged, the record covers the longest prompt
        out = engine.replay([c["prompt"] for c in cases], [c["completion"] for c in cases])
        rows = [(out.record.evict_at[i], out.logprobs[i, : len(c["completion"])]) for i, c in enumerate(cases)]
    else:
        rows = []
        for c in cases:
            out = engine.replay([c["prompt"]], [c["completion"]])
            rows.append((out.record.evict_at[0], out.logprobs[0]))  # [L, Hkv, T], [C]
    return {"rows": rows, "seconds": time.perf_counter() - t0}


def compare_method(project: dict, args, interval: int, cases: list[dict], ref_runs: list[dict]) -> dict:
    units = exact = 0
    jaccard = 0.0
    compressions = 0
    trigger_mismatches = []
    first_mismatch = None
    lp_diffs = []
    per_case = []
    seconds = project["seconds"]
    for ci, (case, ref) in enumerate(zip(cases, ref_runs)):
        P, C = len(case["prompt"]), len(case["completion"])
        assert ref["prompt_len"] == P and ref["completion_len"] == C
        evict_at, logprobs = project["rows"][ci]
        lp_diffs.append((logprobs - ref["token_logprobs"]).abs())
        ref_steps = [r["step"] for r in ref["compressions"]]
        over = [r for r in ref["compressions"] if r["kv_len"] > args.budget]
        want = expected_steps(P, C, args.budget, interval)
        project_stamps = sorted(set(evict_at[evict_at < NEVER].unique().tolist()))
        if [r["step"] for r in over] != want or not set(project_stamps) <= set(want):
            trigger_mismatches.append(
                {"case": ci, "reference_steps": ref_steps, "expected": want, "project_eviction_stamps": project_stamps}
            )
        c_units = c_exact = 0
        c_jacc = 0.0
        for r in over:
            t = r["step"]
            proj = kept_sets_project(evict_at, t)  # [L, Hkv, t]
            ref_kept = r["kept"].long()  # [L, Hkv, K]
            L, H, K = ref_kept.shape
            if int(ref_kept.max()) >= t or int(ref_kept.min()) < 0:
                raise RuntimeError(f"reference kept positions outside [0, {t}) at case {ci} step {t}")
            ref_mask = torch.zeros_like(proj).scatter_(-1, ref_kept, True)
            inter = (proj & ref_mask).sum(-1).float()
            union = (proj | ref_mask).sum(-1).float()
            same = (proj == ref_mask).all(-1)
            c_units += same.numel()
            c_exact += int(same.sum())
            c_jacc += float((inter / union.clamp_min(1)).sum())
            compressions += 1
            if first_mismatch is None and not bool(same.all()):
                layer, head = [int(x) for x in (~same).nonzero()[0]]
                p_set = set(proj[layer, head].nonzero()[:, 0].tolist())
                r_set = set(ref_kept[layer, head].tolist())
                first_mismatch = {
                    "case": ci,
                    "step": t,
                    "prompt_len": P,
                    "layer": layer,
                    "kv_head": head,
                    "project_kept": len(p_set),
                    "reference_kept": len(r_set),
                    "only_project": sorted(p_set - r_set)[:20],
                    "only_reference": sorted(r_set - p_set)[:20],
                }
        units += c_units
        exact += c_exact
        jaccard += c_jacc
        per_case.append(
            {
                "prompt_len": P,
                "compressions": len(over),
                "exact": c_exact / max(c_units, 1),
                "jaccard": c_jacc / max(c_units, 1),
            }
        )
    lp = torch.cat(lp_diffs)
    ref_seconds = sum(r.get("seconds", 0.0) for r in ref_runs)
    return {
        "exact": exact / max(units, 1),
        "jaccard": jaccard / max(units, 1),
        "units": units,
        "compressions": compressions,
        "same_steps": not trigger_mismatches,
        "trigger_mismatches": trigger_mismatches[:2],
        "first_mismatch": first_mismatch,
        "logprob_max_abs_diff": lp.max().item(),
        "logprob_mean_abs_diff": lp.mean().item(),
        "per_case": per_case,
        "seconds": {"project": round(seconds, 1), "reference": round(ref_seconds, 1)},
    }


def tables(view: str, result: dict) -> str:
    """``scripts/render_docs.py``'s view ``kept`` of the results file: per method, the share of (compression,
    layer, KV head) units whose kept sets equal the reference's and their mean Jaccard index, per interval, one
    column per run (named by the tree it tested; ``-`` where a run left the method out)."""
    if view != "kept":
        raise SystemExit(f"error: compare_reference has the view kept, not {view!r}")
    runs = list(result["runs"].values())
    intervals = list(runs[0]["by_interval"])
    methods = list(runs[0]["by_interval"][intervals[0]]["methods"])
    head = " / ".join(f"i{i}" for i in intervals)
    lines = [
        "| method | " + " | ".join(f"{r['project'].split(' (')[0]}, {head}: exact, Jaccard" for r in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for method in methods:
        cells = [
            " / ".join(
                f"{m['exact']:.3f}, {m['jaccard']:.3f}"
                for i in intervals
                if (m := r["by_interval"][i]["methods"].get(method))
            )
            or "-"
            for r in runs
        ]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    where = "; ".join(f"`{r.get('command', '?')}` ({r.get('date', '?')})" for r in runs)
    return "\n".join(lines) + f"\n\n{where}\n"


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        project_config(m, args.budget, args.window, min(args.interval))  # validate early
    model, tokenizer = load_model(args.model)
    model.eval()
    model_dir = model_dir_of(model)
    case_file = make_cases(args, model, tokenizer)
    if args.cases_only:
        return
    chosen = [case_file["cases"][int(i)] for i in args.select.split(",")] if args.select else case_file["cases"]
    cases = [
        dict(c, completion=c["completion"][: args.max_completion or None]) for c in chosen[: args.max_cases or None]
    ]
    effective = Path(tempfile.gettempdir()) / f"reference_e2e_cases_{os.getpid()}.json"
    effective.write_text(json.dumps({"cases": cases}))
    result = {
        "script": "compare_reference",  # scripts/render_docs.py renders the file by this script's tables()
        "command": "python " + " ".join(sys.argv),
        "date": time.strftime("%Y-%m-%d"),
        "budget": args.budget,
        "window": args.window,
        "cases": len(cases),
        "question_indices": [c.get("question_index") for c in cases],
        "prompt_lens": [len(c["prompt"]) for c in cases],
        "completion_lens": [len(c["completion"]) for c in cases],
        "similarity": args.similarity,
        "project": project_description(args),
        "project_rollout": str(Path(sys.modules[CompressionConfig.__module__].__file__).parent),
        "project_batch": args.project_batch,
        "by_interval": {},
    }
    for interval in args.interval:
        projects = {}
        for name in methods:
            projects[name] = replay_project(model, tokenizer, name, args, interval, cases)
            print(
                f"[compare] project {name} interval {interval}: {projects[name]['seconds']:.0f}s",
                file=sys.stderr,
                flush=True,
            )
        reference = run_reference(args, model_dir, interval, methods, effective)
        entry = {"model_check": model_check(model, cases, reference), "methods": {}}
        if "similarity_check" in reference:
            entry["similarity_check"] = reference["similarity_check"]
        for name in methods:
            res = compare_method(projects[name], args, interval, cases, reference["runs"][name])
            entry["methods"][name] = res
            print(
                f"[compare] interval {interval} {name}: exact {res['exact']:.4f} jaccard {res['jaccard']:.4f} "
                f"({res['compressions']} compressions, same steps {res['same_steps']}, "
                f"max |dlogp| {res['logprob_max_abs_diff']:.2e})",
                file=sys.stderr,
                flush=True,
            )
        result["by_interval"][str(interval)] = entry
    print(json.dumps(result))
    if args.output:
        runs = {**args.before, "runs": {**args.before["runs"], args.run: result}}
        args.output.parent.mkdir(parents=True, exist_ok=True)
        partial = args.output.with_name(f".{args.output.name}.partial")  # not gkv_train.jsonio: --project-root's
        partial.write_text(json.dumps(runs, indent=1) + "\n")  # tree comes first on the path and may predate it
        partial.replace(args.output)


if __name__ == "__main__":
    main()
