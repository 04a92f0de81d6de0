"""The entry point of ``gkv_train.benchmarks.bench_s4r`` (its docstring: what it measures, its stages and
examples; ``--help`` lists every argument)."""

from gkv_train.benchmarks.bench_s4r import main, tables  # noqa: F401 (tables: the docs' views of its results)

if __name__ == "__main__":
    main()
