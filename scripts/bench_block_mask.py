"""The entry point of ``gkv_train.benchmarks.bench_block_mask`` (its docstring: what it measures, its stages and
examples; ``--help`` lists every argument)."""

from gkv_train.benchmarks.bench_block_mask import main

if __name__ == "__main__":
    main()
