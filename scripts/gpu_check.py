"""The checks to run in a GPU lease, on models built from real configurations with random weights (the GPU
machine holds no weights), in order of value; each section is printed (stderr) and written under ``--out`` as it
finishes, so a cut run still reports what it did. On one H200 the whole check takes more than one 15-minute lease
(docs/benchmarks/device.md): ``--sections`` runs a part, ``--rollout-tokens`` shortens the rollouts, and
``--budget-s`` starts nothing new past its time (a section already running finishes):

0. ``hardware``: the bf16 matrix rate and the memory bandwidth, measured (seconds): the roofline's ceilings.
1. ``consistency``: for ``gkv`` and ``s4r``, fp32 and bf16, Qwen2.5-1.5B and Llama-3.2-1B shapes, a rollout's
   log-probs against the trainer's under its record with the FlexAttention backend (max |diff|), and the two
   controls that must fail (a plain causal mask; the records rotated by one layer).
2. ``rollout``: the engine with ``full`` and ``gkv`` (budget 512), eager and with ``compile_decode`` (CUDA
   graphs; ``--rollout-modes``), against HF ``generate``, 2048 new tokens (``--rollout-tokens``) at batch 64 and
   256 (Qwen2.5-1.5B shape, bf16): tokens/s, peak memory and the KV cache's, the compression share of decode;
   per decode step the FLOPs and bytes from the configuration, the ceiling they imply on the measured rates, and
   achieved / ceiling.
3. ``training_cost``: forward + backward of 2 sequences of each ``--train-tokens`` (4096) under their G-KV
   record (budget 512) with each ``--train-backends`` (FlexAttention with block masks from the record, and the
   gathered SDPA path) against plain causal SDPA: time, peak memory, FLOPs, achieved / ceiling, and
   ``record_over_causal`` per backend.
4. ``grpo_step``: one ``rl_sparse`` GRPO step through ``train.py`` on a Qwen2.5-0.5B-shape model (random weights,
   bf16, gkv), its seconds and metrics.

Sections run in the order ``--sections`` names them. A section or run that would start after ``--budget-s`` is
skipped and marked so. Writes ``gpu_check.json`` (the
JSON line so far) and ``gpu_check.md`` (a summary) under ``--out``, and prints the JSON line at the end.

    bash scripts/device_check.sh                   # on the GPU machine: install the kit (make device-kit), run this
    python scripts/gpu_check.py --out outputs/gpu     # CUDA, everything already installed
    python scripts/gpu_check.py --tiny --out outputs/gpu   # CPU: tiny shapes and sizes, the same code paths (SDPA
                                                   # for flex in the training cost: FlexAttention's CPU backward
                                                   # is slow)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _roofline import ceiling, decode_step_cost, hardware, matmul_params, peak_memory, reset_peak, timed
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from gkv_rollout.config import CompressionConfig, SamplingConfig
from gkv_rollout.contract.attention import ATTENTION_NAME, head_dim, register
from gkv_rollout.engine import RolloutEngine
from gkv_train.jsonio import dumps, write_atomically
from gkv_train.logprobs import token_logprobs
from gkv_train.models import tiny_config, tiny_tokenizer
from gkv_train.provenance import git_commit
from gkv_train.training.consistency import consistency_report

from _common import ROOT, print_json, random_prompts
from _rollout_timing import compiled_run, engine_run, hf_generate

# Architectures of public checkpoints (their config.json), built here without their weights.
SHAPES = {
    "qwen2.5-1.5b": lambda: Qwen2Config(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "llama-3.2-1b": lambda: LlamaConfig(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=5e5,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "qwen2.5-0.5b": lambda: Qwen2Config(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "tiny-llama": lambda: tiny_config("tiny-llama"),
    "tiny-qwen2": lambda: tiny_config("tiny-qwen2"),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Report:
    """The check's results, written under ``out`` after every section; runs skipped past the time budget."""

    def __init__(self, out: Path | None, budget_s: float):
        self.out, self.budget_s, self.start = out, budget_s, time.perf_counter()
        self.result: dict = {"check": "gpu", "sections": {}}
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def time_left(self) -> bool:
        return self.elapsed() < self.budget_s

    def section(self, name: str, value: dict) -> None:
        self.result["sections"][name] = value
        self.result["seconds"] = round(self.elapsed(), 1)
        print(f"[gpu_check {self.elapsed():.0f}s] {name}: {dumps(value)}", file=sys.stderr, flush=True)
        if self.out is not None:
            write_atomically(self.out / "gpu_check.json", dumps(self.result) + "\n")
            write_atomically(self.out / "gpu_check.md", summary_markdown(self.result))


def build(shape: str, dtype: torch.dtype, device: str, seed: int = 0):
    """A random-weight model of ``shape`` on the registered attention (deterministic in ``seed``)."""
    register()
    config = SHAPES[shape]()
    config._attn_implementation = ATTENTION_NAME
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()


# ---- sections --------------------------------------------------------------------------------------------
def consistency(model, tokenizer, prompts, method: str, args) -> dict:
    """Rollout vs trainer under the record (FlexAttention), with both controls."""
    compression = CompressionConfig(
        method, budget=args.check_budget, window=args.check_window, interval=args.check_interval
    )
    sampling = SamplingConfig(max_new_tokens=args.check_tokens, temperature=1.0, seed=0, ignore_eos=True)
    out = RolloutEngine(model, tokenizer, compression).generate(prompts, sampling)
    report = consistency_report(model, out, backend="flex")
    controls_fail = min(report["causal_mask_diff"], report["rotated_layers_diff"] or 0.0) > 1e-2
    return {**report, "controls_fail": controls_fail, "retention": round(out.retention.mean().item(), 4)}


def rollout_speed(model, tokenizer, batch: int, args, rates: dict, report: Report) -> dict:
    """Engine (full, gkv; eager and compiled) against HF generate at one batch: tokens/s, peak memory, the
    compression share of decode, and each decode step against its roofline ceiling."""
    vocab = min(model.config.vocab_size, 1000)
    prompts = random_prompts([args.rollout_prompt + (i % 8) for i in range(batch)], vocab, seed=2)
    new = args.rollout_tokens
    sampling = SamplingConfig(max_new_tokens=new, temperature=0.6, top_p=0.95, seed=0, ignore_eos=True)
    gkv = CompressionConfig("gkv", budget=args.rollout_budget, window=args.rollout_window)
    # mean keys a decode step attends to: the whole sequence so far, or about the budget (+ half an interval)
    contexts = {
        "full": args.rollout_prompt + new / 2,
        "gkv": min(args.rollout_prompt + new / 2, args.rollout_budget + gkv.resolved.interval / 2),
    }
    result = {}
    warm_up = SamplingConfig(max_new_tokens=4, temperature=0.6, top_p=0.95, seed=0, ignore_eos=True)
    engine_run(model, tokenizer, prompts, warm_up, CompressionConfig("full"))  # the first run pays CUDA's start-up
    modes = {"eager": ("", engine_run), "compiled": ("_compiled", compiled_run)}
    runs = [modes[mode] for mode in args.rollout_modes]
    methods = [c for c in (CompressionConfig("full"), gkv) if c.method in args.rollout_runs]
    for compression in methods:
        for suffix, run in runs:
            name = f"engine_{compression.method}{suffix}"
            if not report.time_left():
                result[name] = {"skipped": "time budget"}
                continue
            reset_peak(args.device)
            r = run(model, tokenizer, prompts, sampling, compression)
            r["peak_bytes"] = peak_memory(args.device)
            step = (r["seconds"] - r["prefill_seconds"]) / new
            r["decode_step_seconds"] = step
            r["roofline"] = ceiling(decode_step_cost(model.config, batch, contexts[compression.method]), rates, step)
            result[name] = r
    for suffix, _ in runs:  # the compressed cache's throughput against the full cache's, decode mode by mode
        full, gkv_run = result.get(f"engine_full{suffix}", {}), result.get(f"engine_gkv{suffix}", {})
        if "tokens_per_s" in full and "tokens_per_s" in gkv_run:
            result[f"gkv_over_full{suffix}"] = gkv_run["tokens_per_s"] / full["tokens_per_s"]
    hf_wanted = "hf_generate" in args.rollout_runs
    if hf_wanted and report.time_left():
        reset_peak(args.device)
        hf = hf_generate(model, tokenizer, prompts, sampling)
        hf["peak_bytes"] = peak_memory(args.device)
        hf["decode_step_seconds"] = hf["seconds"] / new
        hf["roofline"] = ceiling(
            decode_step_cost(model.config, batch, contexts["full"]), rates, hf["decode_step_seconds"]
        )
        result["hf_generate"] = hf
        for name, r in list(result.items()):
            if name.startswith("engine_") and "tokens_per_s" in r:
                result[f"speedup_{name[len('engine_') :]}"] = r["tokens_per_s"] / hf["tokens_per_s"]
    elif hf_wanted:
        result["hf_generate"] = {"skipped": "time budget"}
    return {"batch": batch, "new_tokens": new, "prompt_tokens": args.rollout_prompt, **result}


def training_cost(model, tokenizer, tokens: int, args, rates: dict) -> dict:
    """Forward + backward of ``--train-batch`` sequences of ``tokens`` tokens (a long prompt and a gkv rollout at
    ``--train-budget``) under their record with each of ``--train-backends`` (``flex``: FlexAttention with block
    masks from the record; ``sdpa``: the gathered path, SDPA over each query chunk's kept columns) and under a
    plain causal mask: time, peak memory, roofline, and each backend's ``record_over_causal`` time ratio. On the
    CPU FlexAttention has no backward: its run there is the forward alone (``forward_only``), a rehearsal."""
    vocab = min(model.config.vocab_size, 1000)
    new = args.train_new
    prompts = random_prompts([tokens - new] * args.train_batch, vocab, seed=3)
    compression = CompressionConfig(
        "gkv", budget=args.train_budget, window=args.check_window, interval=args.check_interval
    )
    sampling = SamplingConfig(max_new_tokens=new, temperature=1.0, seed=0, ignore_eos=True)
    out = RolloutEngine(model, tokenizer, compression).generate(prompts, sampling)
    model.train()

    def step(record, backend: str = "sdpa"):
        model.zero_grad(set_to_none=True)
        backward = args.device == "cuda" or backend != "flex"
        with torch.set_grad_enabled(backward):
            logps = token_logprobs(
                model, out.sequences, out.attention_mask, out.num_completion_tokens, record, backend=backend
            )
            if backward:
                logps[out.completion_mask.bool()].sum().backward()

    T, c = out.sequences.shape[1], model.config
    real = int(out.attention_mask.sum())
    layers, head = matmul_params(model.config)
    attention = 3 * 4 * c.num_hidden_layers * c.num_attention_heads * head_dim(c) * T * T / 2 * args.train_batch
    cost = {"flops": 6 * layers * real + 6 * head * out.num_completion_tokens * args.train_batch + attention}
    step(None)  # warm-up
    causal_s, causal_mem = timed(lambda: step(None), args.device)
    result = {
        "batch": args.train_batch,
        "tokens": real,
        "sequence_tokens": T,
        "record_budget": args.train_budget,
        "retention": round(out.retention.mean().item(), 4),
        "causal_sdpa_seconds": causal_s,
        "causal_sdpa_peak_bytes": causal_mem,
        "roofline_causal_sdpa": ceiling(cost, rates, causal_s),
        "record": {},
        "record_over_causal": {},
    }
    for backend in args.train_backends:
        step(out.record, backend)  # warm-up (compiles FlexAttention's kernels)
        seconds, peak = timed(lambda: step(out.record, backend), args.device)
        forward_only = args.device != "cuda" and backend == "flex"
        result["record"][backend] = {
            "seconds": seconds,
            "peak_bytes": peak,
            "forward_only": forward_only,
            "roofline": ceiling(cost, rates, seconds),
        }
        result["record_over_causal"][backend] = None if forward_only else seconds / causal_s
    model.zero_grad(set_to_none=True)
    model.eval()
    return result


def grpo_step(shape: str, args) -> dict:
    """One ``rl_sparse`` step through ``train.py`` on a random-weight model of ``shape`` saved with the tiny
    character tokenizer (the built-in arithmetic task), as a user would run it."""
    with tempfile.TemporaryDirectory() as scratch:
        folder, run = Path(scratch) / "model", Path(scratch) / "run"
        config = SHAPES[shape]()
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16 if args.device == "cuda" else torch.float32
        ).save_pretrained(folder)
        tiny_tokenizer().save_pretrained(folder)
        keys = [
            "recipe=rl_sparse",
            f"model={folder}",
            "max_steps=1",
            f"max_completion_length={args.grpo_tokens}",
            "prompts_per_step=4",
            "num_generations=4",
            "data.limit=16",
            "eval_data.limit=4",
            "save_steps=1000",
            f"compression.budget={args.check_budget}",
            f"output_dir={run}",
            *(["precision=bf16"] if args.device == "cuda" else []),
        ]
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, str(ROOT / "train.py"), *keys],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=args.budget_s,
        )
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            return {"shape": shape, "ok": False, "seconds": seconds, "error": done.stderr[-2000:]}
        metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        step = next(r for r in metrics if "mismatch/max_abs" in r)
        keep = ("loss", "reward", "mismatch/max_abs", "rollout/tokens_per_s", "rollout/retention", "rollout/seconds")
        return {"shape": shape, "ok": True, "seconds": seconds, **{k: step.get(k) for k in keep}}


# ---- summary ---------------------------------------------------------------------------------------------
def gib(count: int | None) -> str:
    """Bytes as GiB, or "-" where not measured (CPU runs report no device peak)."""
    return "-" if count is None else f"{count / 2**30:.1f} GiB"


def tables(view: str, result: dict) -> str:
    """``scripts/render_docs.py``'s view ``runs`` of ``results/gpu_check_<device>.json`` (the device tool's runs
    of this check, each with its command): consistency per shape, method and precision, then the speed and cost
    sections, each with the run it came from."""
    if view != "runs":
        raise SystemExit(f"error: gpu_check has the view runs, not {view!r}")
    stack = ", ".join(f"{name} {version}" for name, version in result["stack"].items())
    lines = []
    sections = [
        (number, name, value)
        for number, run in enumerate(result["runs"], 1)
        for name, value in run["result"]["sections"].items()
    ]
    for _, name, v in sections:
        if name.startswith("consistency/") and "skipped" not in v:
            _, shape, method, precision = name.split("/")
            lines.append(
                f"| {shape} | {method} | {precision} | {v['max_abs_logprob_diff']:.1e} | "
                f"{v['mean_abs_logprob_diff']:.1e} | {v['kl']:.1e} | {v['causal_mask_diff']:.2f} | "
                f"{v['rotated_layers_diff']:.2f} | {'yes' if v['controls_fail'] else '**no**'} |"
            )
    if lines:  # consistency was measured
        lines[:0] = [
            "| shape | method | precision | max \\|diff\\| | mean \\|diff\\| | KL | causal control | rotated control | "
            "controls fail |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        lines.append("")
    lines += ["| section | run | measured |", "|---|---|---|"]
    for number, name, v in sections:
        text = section_text(name, v)
        if text is not None:
            lines.append(f"| {name} | {number} | {text} |")
    commands = []
    for i, run in enumerate(result["runs"], 1):
        note = f", {run['commit_note']}" if run.get("commit_note") else ""
        commands.append(f"run {i}: `{run['command']}` ({run['wall_s']:.0f} s{note})")
    return (
        "\n".join(lines)
        + f"\n\n{result['device']}; {stack}; {result['date']}, commit {result['commit']}; {'; '.join(commands)}\n"
    )


def section_text(name: str, v: dict) -> str | None:
    """What one section of a run measured, in a line (None: a consistency section, shown in its own table)."""
    if "skipped" in v:
        text = f"skipped ({v['skipped']})"
    elif name == "hardware":
        flops, copy = v["bf16_matmul_flops_per_s"] / 1e12, v["memory_bytes_per_s"] / 1e9
        text = f"bf16 matmul {flops:.0f} TFLOP/s, copy {copy:.0f} GB/s"
    elif name.startswith("consistency/"):
        return None  # the consistency table above
    elif name.startswith("rollout/"):
        engines = [
            f"{engine} {r['tokens_per_s']:.0f} tokens/s, {r['decode_step_seconds'] * 1e3:.0f} ms a decode step, "
            f"peak {gib(r['peak_bytes'])}, {r['roofline']['achieved_over_ceiling']:.3f} of its "
            f"{r['roofline']['bound']} ceiling"
            + (
                f", KV cache {gib(r['peak_kv_cache_bytes'])}, compression {r['compress_fraction_of_decode']:.1%} "
                "of decode"
                if r.get("compressions")
                else ""
            )
            if "tokens_per_s" in r
            else f"{engine} skipped ({r['skipped']})"
            for engine, r in v.items()
            if isinstance(r, dict) and ("tokens_per_s" in r or "skipped" in r)
        ]
        ratios = [f"{k} x{r:.2f}" for k, r in v.items() if k.startswith("gkv_over_full")]
        text = f"{v['new_tokens']} new tokens after {v['prompt_tokens']}: " + "; ".join(engines + ratios)
    elif name.startswith("training_cost/") and "record" in v:
        paths = [
            f"{backend} {r['seconds']:.3f} s, peak {gib(r['peak_bytes'])}"
            + (" (forward only)" if r["forward_only"] else f", x{v['record_over_causal'][backend]:.2f} causal")
            for backend, r in v["record"].items()
        ]
        text = (
            f"forward + backward of {v['batch']} x {v['sequence_tokens']} tokens: causal SDPA "
            f"{v['causal_sdpa_seconds']:.3f} s, peak {gib(v['causal_sdpa_peak_bytes'])}; under a G-KV record "
            f"(budget {v['record_budget']}): " + "; ".join(paths)
        )
    elif name.startswith("training_cost/"):  # the first runs' form: one backend
        text = (
            f"forward + backward of {v['batch']} x {v['sequence_tokens']} tokens: under the record "
            f"({v['backend']}) {v['masked_seconds']:.3f} s, peak {gib(v['masked_peak_bytes'])}; "
            f"causal SDPA {v['causal_sdpa_seconds']:.3f} s, peak {gib(v['causal_sdpa_peak_bytes'])} "
            f"(time x{v['time_ratio']:.2f}; {v['roofline_masked']['achieved_over_ceiling']:.2f} and "
            f"{v['roofline_causal_sdpa']['achieved_over_ceiling']:.2f} of the compute ceiling)"
        )
    elif name.startswith("grpo_step/") and not v["ok"]:
        text = f"**failed** in {v['seconds']:.0f} s: {(v['error'].strip().splitlines() or ['?'])[-1]}"
    elif name.startswith("grpo_step/"):
        text = (
            f"ran in {v['seconds']:.0f} s; rollout "
            f"{v['rollout/tokens_per_s']:.0f} tokens/s, retention {v['rollout/retention']:.2f}, bf16 mismatch "
            f"max {v['mismatch/max_abs']:.3f}"
        )
    else:
        text = dumps(v)
    return text


def summary_markdown(result: dict) -> str:
    """gpu_check.md: this run so far, in the docs' view (``tables``) under a title line."""
    published = {
        "stack": result.get("versions", {}),
        "device": result.get("device", "?"),
        "date": time.strftime("%Y-%m-%d"),
        "commit": git_commit(),
        "runs": [{"command": "python " + " ".join(sys.argv), "wall_s": result.get("seconds", 0), "result": result}],
    }
    return f"# gpu_check on {published['device']} ({result.get('seconds', 0)} s)\n\n" + tables("runs", published)


SECTIONS = ["consistency", "rollout", "training_cost", "grpo_step"]
ROLLOUT_RUNS = ["full", "gkv", "hf_generate"]  # the engine's methods and HF generate
ROLLOUT_MODES = ["eager", "compiled"]  # the engine's decode step: eager, compiled (CUDA graphs on a GPU)
TRAIN_BACKENDS = ["flex", "sdpa"]  # the record's forward: FlexAttention (block masks from the record), gathered SDPA


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = parser.add_argument
    add("--tiny", action="store_true", help="CPU-sized: tiny shapes, small batches and lengths")
    add("--shapes", nargs="+", default=None, choices=sorted(SHAPES), help="consistency's shapes")
    add("--batches", nargs="+", type=int, default=None, help="rollout batches (64 256; --tiny 4)")
    add("--budget-s", type=float, default=None, help="start nothing after this (480; --tiny 900)")
    add("--out", type=Path, default=None, help="folder for gpu_check.json and gpu_check.md")
    add("--rollout-tokens", type=int, default=None, help="new tokens a rollout run (2048; --tiny 32)")
    add("--sections", nargs="+", default=SECTIONS, choices=SECTIONS, help="what to run, in this order (all)")
    add("--rollout-runs", nargs="+", default=ROLLOUT_RUNS, choices=ROLLOUT_RUNS, help="the rollout section's runs")
    add(
        "--rollout-modes",
        nargs="+",
        default=None,
        choices=ROLLOUT_MODES,
        help="the engine's decode steps timed (eager and compiled on CUDA; --tiny eager)",
    )
    add("--train-tokens", nargs="+", type=int, default=None, help="training cost: sequence lengths (4096; --tiny 96)")
    add("--train-budget", type=int, default=None, help="training cost: the record's G-KV budget (512; --tiny 64)")
    add(
        "--train-backends",
        nargs="+",
        default=TRAIN_BACKENDS,
        choices=TRAIN_BACKENDS,
        help="training cost: the record's forward, each against causal SDPA (flex: forward only on CPU)",
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        parser.error("no CUDA device: run with --tiny on CPU")
    args.device = "cuda" if cuda else "cpu"
    args.rollout_modes = args.rollout_modes or (ROLLOUT_MODES if cuda else ["eager"])
    tiny = args.tiny
    args.shapes = args.shapes or (["tiny-llama", "tiny-qwen2"] if tiny else ["qwen2.5-1.5b", "llama-3.2-1b"])
    args.speed_shape, args.grpo_shape = (args.shapes[-1], args.shapes[0]) if tiny else ("qwen2.5-1.5b", "qwen2.5-0.5b")
    args.batches = args.batches or ([4] if tiny else [64, 256])
    args.budget_s = (900.0 if tiny else 480.0) if args.budget_s is None else args.budget_s
    args.check_tokens, args.check_budget, args.check_window, args.check_interval = (
        (24, 16, 4, 8) if tiny else (256, 128, 16, 32)
    )
    args.rollout_budget, args.rollout_window, args.rollout_prompt = (16, 4, 64) if tiny else (512, None, 64)
    args.rollout_tokens = (32 if tiny else 2048) if args.rollout_tokens is None else args.rollout_tokens
    if args.rollout_tokens < 1:
        parser.error(f"--rollout-tokens must be at least 1, got {args.rollout_tokens}")
    args.train_new, args.train_batch = (24, 2) if tiny else (256, 2)
    args.train_tokens = args.train_tokens or ([96] if tiny else [4096])
    args.train_budget = args.train_budget or (64 if tiny else 512)
    if min(args.train_tokens) <= args.train_new:
        parser.error(f"--train-tokens must exceed the {args.train_new} sampled tokens, got {args.train_tokens}")
    if args.train_budget <= args.check_window:
        parser.error(f"--train-budget must exceed the window ({args.check_window}), got {args.train_budget}")
    args.grpo_tokens = 16 if tiny else 128
    return args


def main() -> None:
    args = parse_arguments()
    cuda = args.device == "cuda"
    # Each shape its own static graph (FlexAttention, compiled decode): timings after a warm-up at the same shape,
    # no dynamic-shape kernels (torch 2.13's CPU FlexAttention kernel for dynamic shapes fails to compile), and
    # room for every shape this check builds (consistency's shapes and precisions, the lengths, the batches).
    torch._dynamo.config.automatic_dynamic_shapes = False
    torch._dynamo.config.recompile_limit = 64
    tokenizer = tiny_tokenizer()  # prompts are token ids; the engine needs only its padding and end ids
    report = Report(args.out, args.budget_s)
    report.result["device"] = torch.cuda.get_device_name() if cuda else "cpu"
    report.result["versions"] = {m.__name__: m.__version__ for m in (torch, __import__("transformers"))}
    rates = hardware(args.device, args.tiny)
    report.section("hardware", rates)
    speed_model = None  # the rollout's and the training cost's, built once

    def speed() -> torch.nn.Module:
        nonlocal speed_model
        if speed_model is None:
            speed_model = build(args.speed_shape, torch.bfloat16, args.device)
        return speed_model

    def run_consistency() -> None:
        for shape in args.shapes:
            for precision, dtype in DTYPES.items():
                model = build(shape, dtype, args.device) if report.time_left() else None
                for method in ("gkv", "s4r"):
                    name = f"consistency/{shape}/{method}/{precision}"
                    if model is None or not report.time_left():
                        report.section(name, {"skipped": "time budget"})
                        continue
                    vocab = min(model.config.vocab_size, 1000)
                    prompts = random_prompts([17 + 9 * i for i in range(4)], vocab, seed=1)
                    report.section(name, consistency(model, tokenizer, prompts, method, args))
                del model

    def run_rollout() -> None:
        for batch in args.batches:
            name = f"rollout/{args.speed_shape}/bf16/batch{batch}"
            if not report.time_left():
                report.section(name, {"skipped": "time budget"})
                continue
            report.section(name, rollout_speed(speed(), tokenizer, batch, args, rates, report))

    def run_training_cost() -> None:
        for tokens in args.train_tokens:
            name = f"training_cost/{args.speed_shape}/bf16/{tokens}"
            if not report.time_left():
                report.section(name, {"skipped": "time budget"})
                continue
            report.section(name, training_cost(speed(), tokenizer, tokens, args, rates))

    def run_grpo_step() -> None:
        nonlocal speed_model
        speed_model = None
        if cuda:
            torch.cuda.empty_cache()
        name = f"grpo_step/{args.grpo_shape}"
        report.section(name, grpo_step(args.grpo_shape, args) if report.time_left() else {"skipped": "time budget"})

    runners = {
        "consistency": run_consistency,
        "rollout": run_rollout,
        "training_cost": run_training_cost,
        "grpo_step": run_grpo_step,
    }
    for section in dict.fromkeys(args.sections):  # in the order asked, each once
        runners[section]()
    print_json(report.result)


if __name__ == "__main__":
    main()
