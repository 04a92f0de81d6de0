"""The evidence benchmark: ``gkv-train compare`` (``gkv_train.evidence.command``) with this repository's results
files, adapters and figures as its defaults (run from the repository's root); ``--help`` lists every argument.

    OMP_NUM_THREADS=1 python scripts/bench_rl_evidence.py &   # twice: two workers
    python scripts/bench_rl_evidence.py --quick                 # every stage, a tiny random model (a test runs it)
"""

from gkv_train.evidence.command import main
from gkv_train.evidence.tables import tables  # noqa: F401 (the docs' views of results/bench_rl_evidence*.json)

if __name__ == "__main__":
    main()
