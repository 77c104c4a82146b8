"""Toolchains that print from native code (rknn-toolkit2, onnx2tf's TensorFlow) write past Python's
sys.stdout; their chatter goes to a log file, which also keeps what a caller must parse. The command line
sends every toolchain's output there too, and shows it only with -v (sparse_lower/cli/verbosity.py)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path


@contextlib.contextmanager
def output_to(log: Path):
    """Send file descriptors 1 and 2, and Python's sys.stdout and sys.stderr (which need not write to
    them, e.g. under pytest), to `log` for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(log, "ab", buffering=0) as sink, open(log, "a", buffering=1) as text:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
                yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
