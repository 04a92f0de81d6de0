"""The console, also kept in the run's log file (``train.log`` / ``evaluate.log`` in the output folder)."""

from __future__ import annotations

import io
import logging
import re
import sys
from contextlib import contextmanager
from pathlib import Path

ROLLOUT_BAR_DELAY = 5.0  # seconds
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # terminal control sequences (a nested bar moving the cursor)


class LineTee(io.TextIOBase):
    """A text stream that writes to ``console`` as it comes and to ``log`` line by line: of a line rewritten in
    place with carriage returns (a progress bar) only its last state, terminal control sequences left out, so the
    log reads as a transcript."""

    def __init__(self, console, log):
        self.console, self.log = console, log
        self.pending = ""  # the current line, not yet ended

    def write(self, text: str) -> int:
        self.console.write(text)
        *lines, pending = (self.pending + ESCAPES.sub("", text)).split("\n")
        for line in lines:
            self.log.write(line.rstrip("\r").rsplit("\r", 1)[-1] + "\n")
        if lines:
            self.log.flush()
        self.pending = pending.rstrip("\r").rsplit("\r", 1)[-1]  # only the bar's latest state is kept
        return len(text)

    def flush(self) -> None:
        self.console.flush()

    def close_line(self) -> None:
        """Write out an unfinished last line (a progress bar's final state)."""
        if self.pending:
            self.log.write(self.pending + "\n")
            self.pending = ""
        self.log.flush()

    def isatty(self) -> bool:
        return self.console.isatty()

    def fileno(self) -> int:
        return self.console.fileno()

    @property
    def encoding(self):
        return getattr(self.console, "encoding", "utf-8")


@contextmanager
def rollout_progress(rows: int, max_new_tokens: int, enabled: bool = True):
    """A progress bar of one rollout inside a training step (tokens, tokens/s), drawn only once the rollout has
    run ``ROLLOUT_BAR_DELAY`` seconds (a short one draws nothing) and removed when it ends; yields the callback
    ``RolloutEngine.generate(progress=...)`` takes. ``enabled``: False on processes other than the main one. The bar
    is transient: it is drawn on the terminal only, never into the run's log file (``log_console_to``)."""
    from tqdm import tqdm

    bar = tqdm(
        file=getattr(sys.stderr, "console", sys.stderr),
        total=rows * max_new_tokens,
        desc="rollout",
        unit="tok",
        unit_scale=True,
        delay=ROLLOUT_BAR_DELAY,
        leave=False,
        disable=not enabled,
        dynamic_ncols=True,
    )
    try:
        yield bar.update
    finally:
        bar.close()


def log_console_to(path: Path) -> None:
    """From now on, everything this process prints to stdout and stderr also goes to ``path`` (appended; one
    file for both, in the order written). Records of the ``logging`` module reach the file through Hydra's own
    file handler, which writes to the same path."""
    import atexit

    log = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the life of the process)
    consoles = sys.stdout, sys.stderr
    tees = [LineTee(sys.stdout, log), LineTee(sys.stderr, log)]
    sys.stdout, sys.stderr = tees

    def close() -> None:
        sys.stdout, sys.stderr = consoles
        for tee in tees:
            tee.close_line()
        log.close()

    atexit.register(close)


class ConsoleHandler(logging.StreamHandler):
    """A logging handler that writes to whatever ``sys.stderr`` is when a record comes (so records also reach a
    run's log file once the console is kept there: ``log_console_to``)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # logging.StreamHandler sets it; the current sys.stderr is used instead
        pass


def log_records_to_stderr() -> None:
    """Every job's logging: records of level INFO and above to the current stderr (``ConsoleHandler``), formatted
    ``[time][logger][level] - message``; no file of its own, so a refused run leaves nothing behind."""
    handler = ConsoleHandler()
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
