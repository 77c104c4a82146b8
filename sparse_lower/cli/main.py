"""`sparse-lower`: one small class per subcommand (`ConvertCommand` for `convert`, ...); its docstring
is the help."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings

from .. import __version__
from ..errors import SparseLowerError, SparseLowerWarning
from ..runtime import RUNTIME_ERRORS, runtime_refusal
from .bench import BenchCommand
from .convert import ConvertCommand
from .demo import DemoCommand
from .inspect import InspectCommand
from .partition import PartitionCommand
from .run import RunCommand
from .verbosity import Verbosity, add_verbosity_arguments

COMMANDS = (ConvertCommand, InspectCommand, PartitionCommand, RunCommand, DemoCommand, BenchCommand)


def parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The root parser, and each subcommand's parser by name (a bad flag is answered with its usage)."""
    root = argparse.ArgumentParser(
        prog="sparse-lower",
        description="Lower the sparse convolutions of ONNX models to onnxruntime custom ops.")
    root.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = root.add_subparsers(dest="command", required=True)
    subcommands = {}
    for command in COMMANDS:
        doc = command.__doc__.strip()
        sub = subparsers.add_parser(command.name, help=doc.splitlines()[0], description=doc,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        command.add_arguments(sub)
        add_verbosity_arguments(sub)
        sub.set_defaults(handler=command)
        subcommands[command.name] = sub
    return root, subcommands


# The exit statuses (docs/cli.md)
OK, FAILED, REFUSED, BUG, INTERRUPTED = 0, 1, 2, 3, 130


def main(argv: list[str] | None = None) -> int:
    root, subcommands = parser()
    args, unknown = root.parse_known_args(argv)
    if unknown:
        subcommands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    verbosity = Verbosity(args.quiet, args.verbose)
    show = warnings.showwarning

    def show_ours(message, category, *rest, **kwargs):
        """sparse_lower's warnings as one line each, like its errors; others as Python shows them."""
        if issubclass(category, SparseLowerWarning):
            print(f"sparse-lower {args.command}: warning: {message}", file=sys.stderr)
        else:
            show(message, category, *rest, **kwargs)

    def error(kind: str, text: str) -> None:
        print(f"sparse-lower {args.command}: {kind}: {text}", file=sys.stderr)

    try:
        with verbosity.libraries():
            warnings.showwarning = show_ours
            status = args.handler().run(args, verbosity)
            sys.stdout.flush()  # a reader gone away (`| head`) is met here, where it is handled below
            return status
    except SparseLowerError as refusal:
        error("error", str(refusal))
        return REFUSED
    except RUNTIME_ERRORS as refused:
        said = runtime_refusal(refused)  # an op's refusal is ours, in our words; onnxruntime's own, as it says it
        error("error" if isinstance(said, SparseLowerError) else "onnxruntime refused", str(said))
        return REFUSED
    except KeyboardInterrupt as stop:  # a command may say what was done before it, and how to go on
        print(f"\nsparse-lower {args.command}: interrupted" + (f": {stop}" if str(stop) else ""), file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # the reader of stdout went away (`| head`): nothing left to say
        # Python flushes stdout again at exit, which would raise once more: point it at /dev/null.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return OK
    except OSError as failure:  # a path the libraries open themselves (a folder, a full disk, permissions)
        where = f" {failure.filename}" if failure.filename else ""
        error("error", f"cannot use{where}: {failure.strerror or failure} (fix: check the path and its permissions)")
        return REFUSED
    except MemoryError:
        error("error", "out of memory (fix: fewer active sites or frames at once, or a machine with more memory)")
        return REFUSED
    except Exception as bug:  # noqa: BLE001 - anything else is ours to fix: one line, the traceback on -v
        if verbosity.verbose:
            traceback.print_exc()
        error("internal error", f"{type(bug).__name__}: {bug} (fix: a bug in sparse_lower: rerun with -v for the "
                                "traceback and report it)")
        return BUG
    finally:
        warnings.showwarning = show


if __name__ == "__main__":
    sys.exit(main())
