"""What `sparse_lower.export` says when the module does something the model cannot carry
(importers/torch_export.py): each message names the module, the torch call and the source line.

* A torch call that torch.onnx refuses (an operator without an ONNX form): the module is run once more,
  eagerly, with every torch function it calls recorded with the module it runs in and the line of the
  user's code that calls it; the first call of the refused operator is named, with what would work.
* An error of the module's own code while it is traced (an spconv assertion, a shape error): its line.
* A value the tracer fixes into the model (`int(coors[-1, 0])`, a tensor turned into a Python number or
  list): torch's TracerWarning, with the user's line, becomes a SparseLowerWarning and a note in the
  model's import report: frames on which that value differs get the example's.
"""

from __future__ import annotations

import json
import re
import traceback
import warnings
from pathlib import Path

import onnx
import torch
from torch.overrides import TorchFunctionMode

from ..errors import SparseLowerError, SparseLowerWarning
from ..onnx_conventions import IMPORT_KEY
from .traced_calls import LIBRARY_FOLDERS, user_line

_OPERATOR = re.compile(r"'?(aten|prim|onnx)::([A-Za-z0-9_]+)'?")


def _calls(wrapper):
    """(function name, module path, user line) of every torch call the wrapped module makes, in order."""
    module = wrapper.module
    names = {id(m): name or type(module).__name__ for name, m in module.named_modules()}
    stack, calls = [], []

    def enter(m, args):
        stack.append(names[id(m)])

    def leave(m, args, output):
        stack.pop()

    hooks = [h for m in module.modules() for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]

    class Recorder(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            name = getattr(func, "__name__", repr(func))
            calls.append((name, stack[-1] if stack else names[id(module)], user_line(traceback.extract_stack())))
            return func(*args, **(kwargs or {}))

    try:
        with wrapper.engine.inference(module), wrapper.engine.calls(module), Recorder(), torch.no_grad():
            wrapper(*wrapper.tensors)
    except Exception:  # noqa: BLE001 - the calls made up to a failure are what is looked for
        pass
    finally:
        for hook in hooks:
            hook.remove()
    return calls


def explained(error: Exception, wrapper, wrapper_file: str) -> SparseLowerError:
    """`error`, raised while torch.onnx traced the module, as a SparseLowerError: torch.onnx's refusal of
    a call naming the module, the call and its line; an error of the module's own run (raised under the
    forward of the wrapper defined in `wrapper_file`) naming its line."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    found = _OPERATOR.search(str(error))
    fix = ("write it with torch calls that torch.onnx exports (its operator table), or register an ONNX form "
           "for it with torch.onnx.register_custom_op_symbolic before exporting")
    if found is None:
        frames = traceback.extract_tb(error.__traceback__)
        if any(frame.name == "forward" and frame.filename == wrapper_file for frame in frames):  # the module's run
            line = user_line(frames) or f"{frames[-1].filename}:{frames[-1].lineno}"
            return SparseLowerError(f"the module failed while it was traced for export, at {line}: "
                                    f"{type(error).__name__}: {text}",
                                    fix="make the module run on the example as it is (the export runs it once)")
        return SparseLowerError(f"torch.onnx cannot export the module: {text}", fix=fix)
    operator = found.group(2).rstrip("_")
    for name, module, line in _calls(wrapper):
        if name.strip("_") in (operator, f"i{operator}"):  # mul, mul_, __mul__, __imul__
            return SparseLowerError(f"torch.onnx cannot export {found.group(1)}::{operator}, called as {name} at "
                                    f"{line or 'an unknown line'}: {text}", module, fix=fix)
    return SparseLowerError(f"torch.onnx cannot export {found.group(1)}::{operator}: {text}", fix=fix)


def note_frozen(model: onnx.ModelProto, caught, understood=frozenset()) -> None:
    """The tracer's warnings of values it fixed, as SparseLowerWarnings and notes in the import report;
    but those at the (file, line)s of `understood`, which no output depends on."""
    notes = []
    for warning in caught:
        if not issubclass(warning.category, torch.jit.TracerWarning):
            continue
        if any(Path(warning.filename).is_relative_to(folder) for folder in LIBRARY_FOLDERS):
            continue  # torch's, spconv's and the export's own reading of constants
        if (warning.filename, warning.lineno) in understood:
            continue
        message = str(warning.message).split(" might cause")[0]
        note = (f"{warning.filename}:{warning.lineno}: {message} fixes a value of the example into the model. "
                f"Where it changes from frame to frame and the outputs depend on it, compute it with torch operations")
        if note not in notes:
            notes.append(note)
    for note in notes:
        warnings.warn(note, SparseLowerWarning, stacklevel=4)  # the caller of export
    report = {"format": "torch", "notes": notes}
    model.metadata_props.append(onnx.StringStringEntryProto(key=IMPORT_KEY, value=json.dumps(report)))
