"""Where a command writes: one rule for every command, checked before any work (docs/cli.md, Outputs).

A missing folder is created (a file's folder, or the output folder itself), and the command says so; a
path of the wrong kind (a file where a folder of outputs goes, a folder where a file goes) or a place
that cannot be written is refused, naming the option and the fix. Checking first means a typo costs
nothing: the alternative, failing when the output is finally written, throws the run away.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import SparseLowerError
from .verbosity import Verbosity


def _folder(folder: Path, option: str, out: Verbosity) -> None:
    """`folder` exists afterwards (created and said where it did not), and can be written."""
    if folder.exists() and not folder.is_dir():
        raise SparseLowerError(f"{option}: {folder} is a file, not a folder", fix="give a path inside a folder")
    if not folder.exists():
        try:
            folder.mkdir(parents=True)
        except OSError as failure:
            raise SparseLowerError(f"{option}: cannot create the folder {folder}: {failure.strerror or failure}",
                                   fix="give a path where you can write") from failure
        out.say(f"created the folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SparseLowerError(f"{option}: cannot write into {folder}", fix="give a folder where you can write")


def output_file(path: str | os.PathLike, option: str, out: Verbosity, example: str = "model.onnx") -> Path:
    """A file the command writes at its end: refused now if it is a folder; its folder made now."""
    path = Path(path)
    if path.is_dir():
        raise SparseLowerError(f"{option} {path}: a folder, where a file goes",
                               fix=f"give a file name, e.g. {path / example}")
    _folder(path.parent, option, out)
    return path


def output_folder(path: str | os.PathLike, option: str, out: Verbosity, make: bool = True) -> Path:
    """A folder the command fills: refused now if it is a file; made now if missing (`make`; a command
    that may still refuse its input checks first and makes it when it writes, leaving no empty folder)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise SparseLowerError(f"{option} {path}: a file, where the folder of outputs goes",
                               fix="give a folder (it is created if missing)")
    if make:
        _folder(path, option, out)
    return path
