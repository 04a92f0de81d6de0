"""Teacher-force token sequences through the G-KV authors' own generation code and record what it keeps.

Runs in a SEPARATE virtualenv that has the reference's dependencies (transformers 4.51.1, torch, triton), not
in the project's: the reference (microsoft/G-KV at 6db3b2e) is imported from ``--reference-root`` and never
modified; the only changes are monkeypatches made here and listed below.

For every case (prompt ids + completion ids) and every method recipe it calls the reference's patched
``model.generate`` (``gkv.model.gen_patch._sample`` with ``gkv.model.modeling_llama``'s attention and its
``kv_cluster.update_kv``), batch size 1, greedy, with a logits processor that allows only the next completion
token: the sampling loop, its triggering (``output_length % divide_length == 0``), its cache attributes
(``attention_mask``, ``unfinished_sequences``, ``score_cache``, ``pos_ids_cache`` with ``record_pos_ids``) are the
reference's own. A forward hook on the model records, after every forward the loop ran with
``enable_compress=True``, the kept logical positions ``pos_ids_cache[layer]`` [1, Hkv, K] of every layer.

Recipes (``scripts/inference.sh`` of the reference, with ``--budget``/``--window``/``--interval`` as given):
    streaming  method=streamingllm, sink_len 4, window_size = budget - 4
    snapkv     method=score, enable_pooling (kernel_size 5)
    rkv        method=score, enable_pooling, suppressing_redundancy, mix_lambda 0.1
    h2o        method=score, enable_score_cache, smooth_method sum, window_size 1 (alpha 0.8, the CLI default)
    gkv-max / gkv-mean / gkv-sum
               method=score, suppressing_redundancy, mix_lambda 0.5, enable_score_cache, alpha 0.8, smooth_method
Every other ``method_config`` entry takes ``gkv/inference_main.py``'s CLI default; ``divide_length`` = interval.

Monkeypatches (none changes which tokens the reference keeps):
  * ``StreamingLLMKV.update_kv`` returns ``None`` for ``pos_ids_cache``, so the reference never updates
    ``pos_ids_cache`` for StreamingLLM (its recorded positions would stay "everything"). A wrapper computes the
    kept positions with the same rule as its no-padding branch (first ``sink_len`` + last ``window_size`` cache
    slots) and returns them; the keys and values it keeps are untouched.
  * The redundancy term ``cal_similarity_triton`` needs a GPU. ``--similarity torch`` (default) replaces it in
    ``score_based`` by ``similarity_torch`` below, an exact plain-torch equivalent of the kernel;
    ``--similarity triton`` runs the kernel itself under Triton's interpreter (``TRITON_INTERPRET=1``, set
    here before triton is imported), which needs two fixes of the interpreter (Triton 3.2 + numpy 2): its
    ``tensor.__index__`` calls ``int()`` on a 1-element array (an error under numpy 2), and its block-pointer
    boundary check tests only ``offset < shape``, so the kernel's first row block (negative offset whenever
    the cache length is not a multiple of BLOCK_M = 16) reads and writes out of bounds (garbage, then heap
    corruption); real Triton masks ``0 <= offset < shape``. ``--similarity check`` runs both and fails if
    they differ by more than 1e-6 (relative), then uses the kernel's output.

Output (``torch.save``): {"args", "model_check", "runs": {method: [per case: {"prompt_len", "completion_len",
"compressions": [{"step", "kv_len", "kv_len_after", "kept" int32 [L, Hkv, K]}], "token_logprobs" float32 [C]}]}}.
``step`` is the number of tokens in the sequence at the compressing forward (prompt length P at prefill,
P + n at the forward of generated token n): the project's record stamp. ``kv_len`` is the cache length the
compression saw (``update_kv`` is a no-op when it is within the budget: those entries have
``kv_len_after == kv_len``). ``token_logprobs`` are log_softmax(logits) of each forced completion token
(temperature 1) under the compressed cache. ``model_check`` holds the model's full-cache log-probs of each
case's sequence and the full next-token distribution at its last prompt position.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

BUDGET_DEFAULT, WINDOW_DEFAULT, INTERVAL_DEFAULT = 128, 16, 32
METHODS = ("streaming", "snapkv", "rkv", "h2o", "gkv-max", "gkv-mean", "gkv-sum")

# gkv/inference_main.py CLI defaults of every method_config entry.
CLI_DEFAULTS = {
    "compress_mode": "budget",
    "compress_ratio": 0.2,
    "sink_len": 4,
    "enable_pooling": False,
    "suppressing_redundancy": False,
    "mix_lambda": 0.1,
    "retain_ratio": 0.2,
    "retain_direction": "last",
    "enable_score_cache": False,
    "smooth_method": "max",
    "alpha": 0.8,
    "disable_norm": False,
    "attention_shift_indicator": False,
}


def recipe(name: str, budget: int, window: int, interval: int) -> dict:
    """The reference's compression_config (as built by gkv/inference_main.py) for one method of inference.sh."""
    mc = dict(CLI_DEFAULTS, budget=budget, window_size=window)
    method = "score"
    if name == "streaming":
        method = "streamingllm"
        mc.update(sink_len=4, window_size=budget - 4)
    elif name == "snapkv":
        mc.update(enable_pooling=True)
    elif name == "rkv":
        mc.update(enable_pooling=True, suppressing_redundancy=True, mix_lambda=0.1)
    elif name == "h2o":
        mc.update(enable_score_cache=True, smooth_method="sum", window_size=1)
    elif name.startswith("gkv-"):
        mc.update(
            suppressing_redundancy=True, mix_lambda=0.5, enable_score_cache=True, alpha=0.8, smooth_method=name[4:]
        )
    else:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    return {
        "method": method,
        "method_config": mc,
        "record_pos_ids": True,
        "return_sparse_mask": False,
        "divide_length": interval,
    }


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reference-root", default="outputs/reference/G-KV", help="checkout of microsoft/G-KV (6db3b2e)")
    p.add_argument("--model-dir", required=True, help="SmolLM2-135M safetensors directory (gkv_train cache)")
    p.add_argument("--cases", required=True, help="JSON: [{'prompt': [ids], 'completion': [ids]}, ...]")
    p.add_argument("--output", required=True, help="torch file written with the kept positions")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--budget", type=int, default=BUDGET_DEFAULT)
    p.add_argument("--window", type=int, default=WINDOW_DEFAULT)
    p.add_argument("--interval", type=int, default=INTERVAL_DEFAULT)
    p.add_argument("--similarity", choices=("torch", "triton", "check"), default="torch")
    p.add_argument("--attn", choices=("sdpa", "eager"), default="sdpa")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--max-cases", type=int, default=0, help="only the first N cases (0: all)")
    return p.parse_args(argv)


ARGS = parse_args()
if ARGS.similarity != "torch":
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
sys.path.insert(0, str(Path(ARGS.reference_root).resolve()))

import torch  # noqa: E402
from transformers import LlamaConfig, LogitsProcessor, LogitsProcessorList  # noqa: E402

if ARGS.similarity != "torch":
    import numpy as np
    import triton.runtime.interpreter as _ti

    _orig_patch_lang_tensor = _ti._patch_lang_tensor

    def _patch_lang_tensor(tensor):
        _orig_patch_lang_tensor(tensor)
        tensor.__index__ = lambda self: int(self.handle.data.reshape(-1)[0])

    def _materialize_pointers(self, boundary_check):
        n_bytes = self.base.get_element_ty().primitive_bitwidth // 8
        ptrs = np.broadcast_to(self.base.data, self.tensor_shape)
        masks = np.ones(self.tensor_shape, dtype=bool)
        for dim in range(len(self.tensor_shape)):
            bcast = [1] * len(self.tensor_shape)
            bcast[dim] = self.tensor_shape[dim]
            off = (self.offsets[dim].data + np.arange(self.tensor_shape[dim])).reshape(bcast)
            ptrs = ptrs + (n_bytes * off * self.strides[dim].data).astype(np.uint64)
            if dim in boundary_check:
                masks = np.logical_and(masks, (off >= 0) & (off < self.shape[dim].data))
        return _ti.TensorHandle(ptrs, self.base.dtype.scalar), masks

    _ti._patch_lang_tensor = _patch_lang_tensor
    _ti.BlockPointerHandle.materialize_pointers = _materialize_pointers

import gkv.model.compression.score_based as score_based  # noqa: E402
import gkv.model.compression.streamingllm as streamingllm  # noqa: E402
from gkv.model import AutoModelForCausalLM  # noqa: E402
from gkv.model.gen_patch import patch_sample  # noqa: E402
from gkv.utils.compression_score import cal_similarity_triton  # noqa: E402


def similarity_torch(key_states: torch.Tensor, attention_mask: torch.Tensor, threshold=0.5, temperature=1.0):
    """Plain-torch equivalent of the reference's ``cal_similarity_triton`` (its ``similarity_score_kernel``).

    Per (batch, KV head): unit keys u = k / (|k| + 1e-6); cos = u u^T with the diagonal set to 0; for every real
    column n the largest row m with cos[m, n] > threshold gets cos[m, n] = 0 (the kernel walks the row blocks
    from the end and zeroes, per column, the last row above the threshold not yet zeroed); s[m] = sum over real
    columns n of cos[m, n] / (number of real tokens * temperature); padding rows -inf; softmax over the sequence.
    Accumulates in fp32 and returns key_states' dtype for s (as the kernel does) before the softmax.
    """
    B, H, S, D = key_states.shape
    k = key_states.float()
    u = k / (k.norm(dim=-1, keepdim=True) + 1e-6)
    cos = u @ u.transpose(-1, -2)
    cos.diagonal(dim1=-2, dim2=-1).zero_()
    real = attention_mask.bool()  # [B, S]
    rows = torch.arange(S, device=k.device)
    above = (cos > threshold) & real[:, None, :, None] & real[:, None, None, :]
    last = torch.where(above, rows[:, None], -1).amax(dim=-2)  # [B, H, S]: per column n, the last row m
    hit = (rows[:, None] == last[..., None, :]) & (last[..., None, :] >= 0)
    cos = cos.masked_fill(hit, 0.0).masked_fill(~real[:, None, None, :], 0.0)
    s = cos.sum(-1).to(key_states.dtype)
    n_real = attention_mask.sum(dim=-1, keepdim=True).unsqueeze(-1)
    s = s / (n_real * temperature)
    s = s.masked_fill(~real[:, None, :], float("-inf"))
    return torch.softmax(s, dim=-1)


SIMILARITY_CALLS = {"n": 0, "max_rel_diff": 0.0}


def similarity_checked(key_states, attention_mask, threshold=0.5, temperature=1.0):
    kernel = cal_similarity_triton(key_states, attention_mask, threshold, temperature)
    plain = similarity_torch(key_states, attention_mask, threshold, temperature)
    rel = ((kernel - plain).abs() / kernel.abs().clamp_min(1e-30)).max().item()
    SIMILARITY_CALLS["n"] += 1
    SIMILARITY_CALLS["max_rel_diff"] = max(SIMILARITY_CALLS["max_rel_diff"], rel)
    if rel > 1e-6:
        raise AssertionError(f"similarity_torch differs from the Triton kernel by {rel:.3g} (relative)")
    return kernel


if ARGS.similarity == "torch":
    score_based.cal_similarity_triton = similarity_torch
elif ARGS.similarity == "check":
    score_based.cal_similarity_triton = similarity_checked

_orig_streaming_update_kv = streamingllm.StreamingLLMKV.update_kv


def _streaming_update_kv(self, key_states=None, value_states=None, attention_mask=None, **kwargs):
    """The reference's StreamingLLMKV.update_kv, plus the kept positions it never reports."""
    kv_len = key_states.shape[-2]
    k, v, _, _ = _orig_streaming_update_kv(
        self, key_states=key_states, value_states=value_states, attention_mask=attention_mask, **kwargs
    )
    pos = kwargs.get("pos_ids_cache")
    if pos is None or kv_len < self.window_size + self.sink_len:
        return k, v, pos, None
    mask = attention_mask[:, -kv_len:] if attention_mask.shape[-1] > kv_len else attention_mask
    if not bool(torch.all(mask != 0)):
        raise NotImplementedError("positions of the padded StreamingLLM branch are not tracked (batch size 1 only)")
    pos = torch.cat([pos[:, :, : self.sink_len], pos[:, :, -self.window_size :]], dim=2)
    assert pos.shape[-1] == k.shape[-2]
    return k, v, pos, None


streamingllm.StreamingLLMKV.update_kv = _streaming_update_kv
patch_sample()


def llama_config(model_dir: Path, compression: dict | None) -> LlamaConfig:
    """A transformers-4.51 LlamaConfig of SmolLM2-135M (its config.json is written by transformers 5.x)."""
    raw = json.loads((model_dir / "config.json").read_text())
    rope = raw.get("rope_parameters") or {}
    theta = raw.get("rope_theta", rope.get("rope_theta", 100000.0))
    assert rope.get("rope_type", "default") == "default", rope
    cfg = LlamaConfig(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"],
        num_attention_heads=raw["num_attention_heads"],
        num_key_value_heads=raw["num_key_value_heads"],
        head_dim=raw.get("head_dim", raw["hidden_size"] // raw["num_attention_heads"]),
        hidden_act=raw.get("hidden_act", "silu"),
        max_position_embeddings=raw.get("max_position_embeddings", 8192),
        rms_norm_eps=raw["rms_norm_eps"],
        rope_theta=theta,
        tie_word_embeddings=raw.get("tie_word_embeddings", True),
        attention_bias=raw.get("attention_bias", False),
        mlp_bias=raw.get("mlp_bias", False),
        bos_token_id=raw.get("bos_token_id"),
        eos_token_id=raw.get("eos_token_id"),
        pad_token_id=raw.get("pad_token_id"),
    )
    if compression is not None:
        cfg.update(compression)
    return cfg


def build_model(model_dir: Path, compression: dict):
    """The reference's patched Llama, as gkv/inference_main.py builds it (fp32, CPU)."""
    cfg = llama_config(model_dir, compression)
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), config=cfg, torch_dtype=torch.float32, attn_implementation=ARGS.attn
    )
    model.eval()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr() or not cfg.tie_word_embeddings
    return model


class ForceTokens(LogitsProcessor):
    """Allows only the next completion token (greedy then picks it); records its log-prob under the logits."""

    def __init__(self, prompt_len: int, completion: list[int]):
        self.prompt_len = prompt_len
        self.completion = torch.tensor(completion, dtype=torch.long)
        self.logprobs: list[float] = []

    def __call__(self, input_ids, scores):
        n = input_ids.shape[1] - self.prompt_len
        token = self.completion[n]
        self.logprobs.append(torch.log_softmax(scores.float(), dim=-1)[0, token].item())
        forced = torch.full_like(scores, float("-inf"))
        forced[:, token] = 0.0
        return forced


def run_case(model, prompt: list[int], completion: list[int], budget: int) -> dict:
    records = []
    state = {}

    def pre_hook(module, args, kwargs):
        pkv = kwargs.get("past_key_values")
        ids = kwargs.get("input_ids")
        state["kv_before"] = pkv.get_seq_length() if pkv is not None and pkv.key_cache else 0
        state["q_len"] = ids.shape[1]

    def hook(module, args, kwargs, output):
        if not kwargs.get("enable_compress"):
            return
        pkv = kwargs["past_key_values"]
        kv_len = state["kv_before"] + state["q_len"]
        kept = torch.stack([pkv.pos_ids_cache[layer][0] for layer in range(len(pkv.pos_ids_cache))]).to(torch.int32)
        after = [pkv.key_cache[layer].shape[-2] for layer in range(len(pkv.key_cache))]
        assert len(set(after)) == 1 and kept.shape[-1] == after[0], (kept.shape, after)
        records.append(
            {"step": int(kwargs["cur_len"]), "kv_len": kv_len, "kv_len_after": after[0], "kept": kept.clone()}
        )

    h1 = model.register_forward_pre_hook(pre_hook, with_kwargs=True)
    h2 = model.register_forward_hook(hook, with_kwargs=True)
    force = ForceTokens(len(prompt), completion)
    try:
        input_ids = torch.tensor([prompt], dtype=torch.long)
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                logits_processor=LogitsProcessorList([force]),
                do_sample=False,
                top_p=None,
                temperature=None,
                max_new_tokens=len(completion),
                use_cache=True,
                eos_token_id=model.config.eos_token_id,
                pad_token_id=model.config.pad_token_id,
                return_dict_in_generate=True,
            )
    finally:
        h1.remove()
        h2.remove()
    generated = out.sequences[0, len(prompt) :].tolist()
    if generated != list(completion):
        raise RuntimeError(f"the reference loop did not reproduce the forced completion ({len(generated)} tokens)")
    return {
        "prompt_len": len(prompt),
        "completion_len": len(completion),
        "compressions": records,
        "token_logprobs": torch.tensor(force.logprobs, dtype=torch.float32),
    }


@torch.no_grad()
def model_check(model_dir: Path, cases: list[dict]) -> list[dict]:
    """Full-cache log-probs of the reference model (``method`` irrelevant: use_cache=False skips compression)."""
    model = build_model(model_dir, recipe("snapkv", ARGS.budget, ARGS.window, ARGS.interval))
    checks = []
    for case in cases:
        ids = torch.tensor([case["prompt"] + case["completion"]], dtype=torch.long)
        logits = model(input_ids=ids, use_cache=False).logits.float()
        lp = torch.log_softmax(logits[0], dim=-1)
        P = len(case["prompt"])
        checks.append(
            {
                "sequence_logprobs": lp[:-1].gather(-1, ids[0, 1:, None])[:, 0].clone(),
                "last_prompt_logprobs": lp[P - 1].clone(),
            }
        )
    return checks


def cases_digest(cases: list[dict]) -> str:
    """sha256 of the cases' token ids (the compare script checks a reused result against its cases)."""
    return hashlib.sha256(json.dumps([[c["prompt"], c["completion"]] for c in cases]).encode()).hexdigest()


def main():
    if ARGS.threads:
        torch.set_num_threads(ARGS.threads)
    model_dir = Path(ARGS.model_dir)
    cases = json.loads(Path(ARGS.cases).read_text())
    cases = cases["cases"] if isinstance(cases, dict) else cases
    if ARGS.max_cases:
        cases = cases[: ARGS.max_cases]
    methods = [m for m in ARGS.methods.split(",") if m]
    result = {
        "args": vars(ARGS),
        "cases_digest": cases_digest(cases),
        "model_check": model_check(model_dir, cases),
        "runs": {},
        "recipes": {},
    }
    for name in methods:
        compression = recipe(name, ARGS.budget, ARGS.window, ARGS.interval)
        result["recipes"][name] = compression
        model = build_model(model_dir, compression)
        runs = []
        for i, case in enumerate(cases):
            t0 = time.perf_counter()
            run = run_case(model, case["prompt"], case["completion"], ARGS.budget)
            run["seconds"] = time.perf_counter() - t0
            runs.append(run)
            real = [r for r in run["compressions"] if r["kv_len_after"] < r["kv_len"]]
            print(
                f"[reference] {name} case {i}: P={run['prompt_len']} C={run['completion_len']} "
                f"compress calls={len(run['compressions'])} evicting={len(real)} {run['seconds']:.1f}s",
                file=sys.stderr,
                flush=True,
            )
        result["runs"][name] = runs
        del model
    if ARGS.similarity == "check":
        result["similarity_check"] = dict(SIMILARITY_CALLS)
        print(f"[reference] similarity check: {SIMILARITY_CALLS}", file=sys.stderr)
    Path(ARGS.output).parent.mkdir(parents=True, exist_ok=True)
    torch.save(result, ARGS.output)


if __name__ == "__main__":
    main()
