"""The trainers (GRPO under the record, Sparse-RL's dense learner, distillation), the launcher and the trainer's
log-probs."""
