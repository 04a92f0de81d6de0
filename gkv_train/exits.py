"""How a command ends when it does not finish its work, each with one line on stderr and its own exit code.

=====  ==========================================================================================================
code   meaning
=====  ==========================================================================================================
0      done
1      failed during the work (a traceback, or ``error: ...`` for a full disk)
2      refused before any work (``error: ...``): a configuration value, a limit, a path, the output folder in use;
       nothing was done and no output folder was created
130    stopped by SIGINT (Ctrl-C), 143 by SIGTERM (128 + the signal's number): training stops at a step boundary
       with a complete checkpoint, which ``resume=last`` continues
=====  ==========================================================================================================

Leaf module (no project imports): the command line imports it before anything heavy.
"""

from __future__ import annotations

from contextlib import contextmanager

REFUSED = 2


class Refused(Exception):
    """A run refused before any work; its message is the line shown."""


class RunLocked(Exception):
    """Another live process holds the lock of a run's folder or file (``gkv_train.runs.runlock``; the message names
    the holder): refused."""


class Preempted(BaseException):
    """A signal stopped the run (the message says where it stands); the process exits with ``code`` (128 + the
    signal's number: 143 for SIGTERM, 130 for SIGINT). A BaseException, so that no ``except Exception`` on the way
    swallows it."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum, self.code = signum, 128 + signum


@contextmanager
def refusing():
    """Marks a job's checks before any work: a ValueError, OSError or RunLocked raised inside becomes ``Refused``
    with its message on one line. What fails later, once work has begun, keeps its traceback."""
    try:
        yield
    except Refused:
        raise
    except (ValueError, OSError, RunLocked) as err:
        raise Refused(" ".join(str(err).split("\n"))) from err
