"""``verifier_probe.slow_first_use`` in a module with a ``warm_up``: the worker pays the first-use cost before it says
it is ready, outside every check's time limit."""

from verifier_probe import slow_first_use


def warm_up():
    # the comparison the test times: pays the probe's sleep and math-verify's import and first parse (a plain-number
    # pair would never reach math-verify, leaving its first use inside the limit)
    slow_first_use(r"\frac{1}{2}", "0.5")


__all__ = ["slow_first_use", "warm_up"]
