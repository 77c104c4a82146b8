"""Toolchains that print from native code (rknn-toolkit2, onnx2tf's TensorFlow) write past Python's
sys.stdout; their chatter goes to a log file, which also keeps what a caller must parse. The command line
sends every toolchain's output there too, and shows it only with -v (sparse_lower/cli/verbosity.py)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path


@contextlib.contextmanager
def output_to(log: Path, stderr: bool = True):
    """Send file descriptors 1 and 2, and Python's sys.stdout and sys.stderr (which need not write to
    them, e.g. under pytest), to `log` for the duration; with `stderr=False`, stdout only."""
    sys.stdout.flush()
    sys.stderr.flush()
    fds = (1, 2) if stderr else (1,)
    saved = [os.dup(fd) for fd in fds]
    with open(log, "ab", buffering=0) as sink, open(log, "a", buffering=1) as text:
        for fd in fds:
            os.dup2(sink.fileno(), fd)
        try:
            with contextlib.redirect_stdout(text), \
                    (contextlib.redirect_stderr(text) if stderr else contextlib.nullcontext()):
                yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip(fds, saved):
                os.dup2(copy, fd)
                os.close(copy)
