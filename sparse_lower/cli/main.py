"""`sparse-lower`: one small class per subcommand (`ConvertCommand` for `convert`, ...); its docstring
is the help."""

from __future__ import annotations

import argparse
import sys
import warnings

import onnxruntime.capi.onnxruntime_pybind11_state as ort_state

from .. import __version__
from ..errors import SparseLowerError, SparseLowerWarning
from .bench import BenchCommand
from .convert import ConvertCommand
from .demo import DemoCommand
from .inspect import InspectCommand
from .partition import PartitionCommand
from .run import RunCommand

COMMANDS = (ConvertCommand, InspectCommand, PartitionCommand, RunCommand, DemoCommand, BenchCommand)


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="sparse-lower",
        description="Lower the sparse convolutions of ONNX models to onnxruntime custom ops.")
    root.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = root.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        doc = command.__doc__.strip()
        sub = subparsers.add_parser(command.name, help=doc.splitlines()[0], description=doc,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        command.add_arguments(sub)
        sub.set_defaults(handler=command)
    return root


# What onnxruntime raises when a model or its inputs are refused at session creation or run time
# (a coordinate outside the grid, a capacity exceeded, …): the message says what is wrong.
_RUNTIME_ERRORS = tuple(getattr(ort_state, name) for name in ("Fail", "InvalidArgument", "InvalidGraph",
                                                              "RuntimeException", "NoSuchFile"))


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    show = warnings.showwarning

    def show_ours(message, category, *rest, **kwargs):
        """sparse_lower's warnings as one line each, like its errors; others as Python shows them."""
        if issubclass(category, SparseLowerWarning):
            print(f"sparse-lower {args.command}: warning: {message}", file=sys.stderr)
        else:
            show(message, category, *rest, **kwargs)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always", SparseLowerWarning)
            warnings.showwarning = show_ours
            return args.handler().run(args)
    except SparseLowerError as error:
        print(f"sparse-lower {args.command}: error: {error}", file=sys.stderr)
        return 2
    except _RUNTIME_ERRORS as error:
        print(f"sparse-lower {args.command}: onnxruntime refused: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
