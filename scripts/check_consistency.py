"""Roll out with a compressed cache, recompute the log-probs as the trainer does, print one JSON line.

    python scripts/check_consistency.py --model tiny --method gkv
    python scripts/check_consistency.py --model smollm2-135m --method rkv --budget 64 --window 8 --interval 16
    python scripts/check_consistency.py --model smollm2-135m --method gkv --precision bf16

``--precision bf16`` runs as training does (``precision=bf16``): fp32 weights, rollout and trainer forwards under
bf16 autocast.
"""

from gkv_train.training.consistency import check

if __name__ == "__main__":
    check()  # the same as `gkv-train check ...`
