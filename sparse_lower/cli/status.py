"""One-line status for the steps that take a while (a lowering of a UNet, a verification on a real
frame take seconds to minutes): what is running now, then how long it took.

Status goes to stderr, so that stdout stays the result a script reads; `-q` silences it. On a terminal
the line is rewritten in place when the step ends; elsewhere (a log, a pipe) each step prints one line
when it ends, and one when it starts if it is still running after LONG_STEP_S: a reader of the log
never waits long without a line saying what runs.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator, TextIO


LONG_STEP_S = 5.0


class Status:
    def __init__(self, quiet: bool = False, stream: TextIO | None = None):
        self.quiet = quiet
        self.stream = stream or sys.stderr

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        """Say `what` is running (on a terminal), then that it is done and how long it took; a step that
        fails says nothing more (its error does)."""
        terminal = self.stream.isatty()
        if not self.quiet and terminal:
            print(f"{what} …", end="", file=self.stream, flush=True)
        started = threading.Timer(LONG_STEP_S, lambda: print(f"{what} …", file=self.stream, flush=True))
        if not self.quiet and not terminal:
            started.daemon = True
            started.start()
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            if not self.quiet and terminal:
                print(file=self.stream)  # end the status line: the error comes on its own
            raise
        finally:
            started.cancel()
        if not self.quiet:
            prefix = "\r" if terminal else ""
            print(f"{prefix}{what}: {time.perf_counter() - start:.1f} s", file=self.stream, flush=True)
