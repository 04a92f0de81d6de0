"""Does training see what inference saw? Compare trainer log-probs under a record with the rollout's own."""

from __future__ import annotations

import argparse
import time

import torch

from gkv_rollout.config import SamplingConfig, add_compression_args, compression_from_args
from gkv_rollout.contract.eviction import resolved_backend
from gkv_rollout.engine import RolloutEngine
from gkv_rollout.methods import ModelShape
from gkv_train.config.options import check_compile_decode, check_range, check_seed
from gkv_train.config.preflight import (
    Generation,
    WeightlessModel,
    available_memory,
    check_generations,
    prompt_tokens,
    reset_peak_resident,
    status_bytes,
)
from gkv_train.jsonio import dumps
from gkv_train.logprobs import token_logprobs
from gkv_train.models import (
    TINY_ALIAS,
    TINY_MODELS,
    check_model,
    load_model,
    random_prompts,
)
from gkv_train.problems.data import gsm8k_questions
from gkv_train.storage import size_text


def logprob_mismatch(model, out, record, temperature: float = 1.0, backend: str = "auto") -> dict[str, float]:
    """``mismatch_stats`` of the trainer's log-probs against a rollout ``out``'s (``gkv_rollout.engine.RolloutOutput``)
    over its real completion tokens, the trainer attending under ``record`` (None: plain causal) with the mask
    ``backend`` (auto, sdpa, flex)."""
    with torch.no_grad():
        trainer = token_logprobs(
            model,
            out.sequences,
            out.attention_mask,
            out.num_completion_tokens,
            record,
            temperature=temperature,
            backend=backend,
        )
    return mismatch_stats(trainer, out.logprobs, out.completion_mask)


def forward_cost(model, out, record, temperature: float, backend: str) -> tuple[dict, float, int | None]:
    """``logprob_mismatch`` under ``record`` and what that no-grad forward cost: seconds, and the memory it added
    at its peak (CUDA: allocated device memory; elsewhere resident memory from /proc: None where the system does not
    say). Under FlexAttention a record's forward compiles its kernels on first use: one untimed forward first (an
    S4R record, which attends through SDPA under any backend, pays it for nothing)."""
    cuda = out.sequences.is_cuda
    if record is not None and resolved_backend(backend, cuda) == "flex":
        logprob_mismatch(model, out, record, temperature, backend)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        before = status_bytes("VmRSS") if reset_peak_resident() else None
    start = time.perf_counter()
    found = logprob_mismatch(model, out, record, temperature, backend)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() if cuda else status_bytes("VmHWM")
    return found, seconds, None if before is None or peak is None else peak - before


def consistency_report(model, out, temperature: float = 1.0, backend: str = "auto") -> dict:
    """The rollout's record (max and mean |diff|, KL) against two controls that must fail: a plain causal mask,
    and the per-layer masks rotated by one layer (None where it cannot differ: ``full``, which has no record, and
    a record that is the same in every layer, as StreamingLLM's is). What the no-grad forward under the record cost
    (``forward_cost``): ``forward_seconds``, ``forward_memory_bytes``."""
    own, seconds, memory = forward_cost(model, out, out.record, temperature, backend)
    report = {
        "max_abs_logprob_diff": own["max_abs"],
        "mean_abs_logprob_diff": own["mean_abs"],
        "kl": own["kl"],
        "forward_seconds": seconds,
        "forward_memory_bytes": memory,
        "causal_mask_diff": logprob_mismatch(model, out, None, temperature, backend)["max_abs"],
        "rotated_layers_diff": None,
    }
    rolled = None if out.record is None else out.record.roll_layers(1)
    if rolled is not None and not all(torch.equal(v, rolled.to_batch()[k]) for k, v in out.record.to_batch().items()):
        report["rotated_layers_diff"] = logprob_mismatch(model, out, rolled, temperature, backend)["max_abs"]
    return report


RATIO_QUANTILES = (0.01, 0.05, 0.5, 0.95, 0.99)


def mismatch_stats(trainer_logps, rollout_logps, mask) -> dict[str, float]:
    """Rollout vs trainer log-probs over the completion tokens (trainer_logps, rollout_logps float [B, T]; mask
    [B, T]): mean and max |d| with d = trainer - rollout; KL(rollout || trainer) estimated from the rollout's own
    samples with the non-negative k3 estimator exp(d) - d - 1; the quantiles of the per-token probability ratio
    exp(d) (``ratio_p1`` ... ``ratio_p99``); and the tail of the per-token agreement min(exp(d), exp(-d)) =
    exp(-|d|), its 5th percentile (``agreement_p5``: Sparrow's stability statistic, arXiv 2606.08446; training
    stayed stable above ~0.86). For a learner under the exact record these show float rounding only; for a dense
    learner of compressed rollouts, what importance sampling has to correct."""
    mask = mask.bool()
    d = (trainer_logps - rollout_logps)[mask].double()  # float64: the k3 terms cancel to ~1e-12
    if d.numel() == 0:  # no completion token: no mismatch
        d = torch.zeros(1, dtype=torch.float64, device=d.device)
    quantiles = torch.quantile(d, torch.tensor(RATIO_QUANTILES, dtype=d.dtype, device=d.device)).exp().tolist()
    return {
        "mean_abs": d.abs().mean().item(),
        "max_abs": d.abs().max().item(),
        "kl": (d.exp() - d - 1).mean().item(),
        **{f"ratio_p{round(q * 100)}": value for q, value in zip(RATIO_QUANTILES, quantiles)},
        "agreement_p5": torch.quantile(-d.abs(), 0.05).exp().item(),
    }


CHECK_USAGE = """Roll out with a compressed cache, recompute the log-probs as the trainer does, print one JSON line.

    gkv-train check --model tiny --method gkv                 (or: python scripts/check_consistency.py ...)
    gkv-train check --model smollm2-135m --method rkv --budget 64 --window 8 --interval 16
    gkv-train check --model smollm2-135m --method gkv --precision bf16

--precision bf16 runs as training does (precision=bf16): fp32 weights, rollout and trainer forwards under
bf16 autocast."""


def check_arguments(args) -> tuple:
    """(the compression, the prompts) of ``check``'s arguments, every one checked before the model loads
    (ValueError / OSError naming the flag): the compression and the model, --batch and --max-new-tokens at least
    1, a finite --temperature > 0 (the trainer's log-probs are those of softmax(logits / temperature)), a --seed
    the generators take, and the rollout within the model's context and the memory free (``check_generations``)."""
    compression = compression_from_args(args)
    check_compile_decode(args.compile_decode, [compression], key="--compile-decode")
    for flag, value in (("--batch", args.batch), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            raise ValueError(f"{flag} must be at least 1, got {value}")
    check_range("--temperature", args.temperature, low=0, low_open=True, note=" (log-probs of logits / temperature)")
    check_seed("--seed", args.seed)
    check_model(args.model)  # a name that is nowhere: named at once, not after the hub's retries
    weightless = WeightlessModel(args.model)
    config, tokenizer = weightless.config, weightless.tokenizer
    if args.model in (TINY_ALIAS, *TINY_MODELS):  # token ids: row i has 7 + 11 i tokens
        context = config.max_position_embeddings
        if 7 + 11 * (args.batch - 1) > context:
            raise ValueError(
                f"--batch={args.batch}: row i of a tiny model's check has 7 + 11 i prompt tokens, so at most "
                f"{(context - 7) // 11 + 1} rows fit its context of {context} tokens"
            )
        prompts = random_prompts([7 + 11 * i for i in range(args.batch)], config.vocab_size, args.seed)
    else:
        prompts = gsm8k_questions(args.batch)
        if len(prompts) < args.batch:
            raise ValueError(f"--batch={args.batch}: the GSM8K test file holds {len(prompts)} questions")
    ids, new = list(range(args.batch)), args.max_new_tokens
    rollout = Generation("check", prompts, ids, args.batch, new, [compression], "--max-new-tokens", rows_key="--batch")
    check_generations(weightless, [rollout], dtype_bytes=4, device="cpu")
    shape = weightless.shape
    check_forward_memory(shape, args.batch, max(prompt_tokens(tokenizer, prompts, shape.context)[0]) + new)
    return compression, prompts


def check_forward_memory(shape: ModelShape, rows: int, width: int) -> None:
    """ValueError when the check's no-grad forwards (``rows`` sequences of ``width`` tokens) would not fit the
    memory free: on CPU they attend through SDPA with one layer's dense boolean mask [rows, KV heads, T, T] at a
    time, expanded to the query heads (tiny-llama, estimated / measured: 500 / 353 MB at 80 rows of 884 tokens,
    524 / 174 MB at 4 rows of 4047)."""
    need = rows * width**2 * (shape.kv_heads + shape.heads)
    free, where = available_memory("cpu")
    if need > free:
        raise ValueError(
            f"the check's forwards ({rows} rows of {width} tokens on {shape.name}) attend with a dense mask: about "
            f"{size_text(need)}, more than the {size_text(free)} of {where}: lower --batch or --max-new-tokens"
        )


def check(argv: list[str] | None = None) -> dict:
    """``scripts/check_consistency.py`` / ``gkv-train check``: roll out with a compressed cache, recompute the
    log-probs as the trainer does, print one JSON line (returned too)."""
    parser = argparse.ArgumentParser(
        prog="gkv-train check", description=CHECK_USAGE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny", help="tiny, tiny-qwen2, tiny-qwen3, smollm2-135m, HF name or path")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--compile-decode", action="store_true", help="decode steps as compiled graphs")
    parser.add_argument(
        "--backend",
        choices=["auto", "sdpa", "flex"],
        default="auto",
        help="how the trainer's forward attends under the record (mask_backend): auto, sdpa or flex",
    )
    add_compression_args(parser, method="gkv", budget=32, window=8, interval=16)
    args = parser.parse_args(argv)
    try:
        compression, prompts = check_arguments(args)
    except (ValueError, OSError) as err:
        parser.error(str(err))  # one line and exit 2, before any work

    model, tokenizer = load_model(args.model)
    sampling = SamplingConfig(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        ignore_eos=True,
        compile_decode=args.compile_decode,
    )
    device = next(model.parameters()).device.type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
        out = RolloutEngine(model, tokenizer, compression).generate(prompts, sampling)
        report = consistency_report(model, out, args.temperature, args.backend)
    result = {
        "method": compression.method,
        "model": args.model,
        "precision": args.precision,
        "compile_decode": args.compile_decode,
        "backend": args.backend,
        **report,
        "consistent": report["max_abs_logprob_diff"] <= 1e-4,
        "compressions": out.stats["compressions"],
        "batch": out.sequences.shape[0],
        "prompt_lengths": out.prompt_lengths.tolist(),
        "new_tokens": out.stats["new_tokens"],
        "retention": round(out.retention.mean().item(), 4),
        "config": compression.identity(),
    }
    print(dumps(result), flush=True)
    return result
