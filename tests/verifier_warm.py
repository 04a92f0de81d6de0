"""``verifier_probe.slow_first_use`` in a module with a ``warm_up``: the worker pays the first-use cost before it says
it is ready, outside every check's time limit."""

from verifier_probe import slow_first_use


def warm_up():
    slow_first_use("1", "1")


__all__ = ["slow_first_use", "warm_up"]
