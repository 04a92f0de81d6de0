"""A run's folder: outputs checked before any work, one run per folder, crash-safe checkpoints, resume."""
