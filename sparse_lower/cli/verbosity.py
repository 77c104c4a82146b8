"""-q and -v, alike in every subcommand (polygraphy's convention): by default a command prints its
results and short notes, and the libraries it drives keep their log lines to themselves; -q leaves only
the results (what was written, the verdict) and errors; -v lets onnxruntime's log, the quantizer's
`logging` lines, other packages' warnings and the toolchains' own output through, and adds the traceback
to an unexpected error.

The libraries' lines are not ours to word: onnxruntime logs a refusal it also raises (the error says it
once, in our words), its quantizer logs advice for image models, TVM warns from C++ about every Gather it
compiles. A user reading a conversion sees them as failures when nothing failed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import onnxruntime

from .. import runtime
from ..errors import SparseLowerWarning
from ..toolchains.quiet import output_to

# onnxruntime's severities: 0 verbose, 1 info, 2 warning (its default), 3 error, 4 fatal
_ORT_QUIET, _ORT_VERBOSE, _ORT_DEFAULT = 4, 2, 2


def add_verbosity_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-q", "--quiet", action="store_true",
                       help="only the results and errors: no tables, notes, status lines or progress bar")
    group.add_argument("-v", "--verbose", action="store_true",
                       help="also onnxruntime's and the toolchains' log lines, other packages' warnings, and the "
                            "traceback of an unexpected error")


class Verbosity:
    def __init__(self, quiet: bool = False, verbose: bool = False):
        self.quiet = quiet
        self.verbose = verbose

    def say(self, text: str) -> None:
        """A table or a note: printed unless -q."""
        if not self.quiet:
            print(text)

    @contextmanager
    def libraries(self) -> Iterator[None]:
        """onnxruntime's default logger, Python's `logging` and other packages' warnings set for this
        verbosity while the command runs."""
        onnxruntime.set_default_logger_severity(_ORT_VERBOSE if self.verbose else _ORT_QUIET)
        sessions = runtime.SESSION_LOG_SEVERITY
        runtime.SESSION_LOG_SEVERITY = _ORT_VERBOSE if self.verbose else _ORT_QUIET
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.INFO if self.verbose else logging.ERROR)
        if self.verbose and not root.handlers:
            logging.basicConfig(format="%(levelname)s:%(name)s:%(message)s")
        try:
            with warnings.catch_warnings():
                if not self.verbose:
                    warnings.simplefilter("ignore")
                warnings.simplefilter("always", SparseLowerWarning)  # ours are said, one line each
                yield
        finally:
            root.setLevel(level)
            onnxruntime.set_default_logger_severity(_ORT_DEFAULT)
            runtime.SESSION_LOG_SEVERITY = sessions

    @contextmanager
    def captured(self) -> Iterator[None]:
        """What native code writes to stdout and stderr (a toolchain's compiler: TVM's C++ warnings,
        rknn's build log) kept out of the command's output, and shown on stderr with -v."""
        with tempfile.TemporaryDirectory() as folder:
            log = Path(folder) / "toolchain.log"
            try:
                with output_to(log):
                    yield
            finally:
                if self.verbose and log.exists():
                    sys.stderr.write(log.read_text(errors="replace"))
                    sys.stderr.flush()
