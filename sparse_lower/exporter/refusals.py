"""What `sparse_lower.export` says when the module does something the model cannot carry
(exporter/trace.py): each message names the module, the torch call and the source line.

* A torch call that torch.onnx refuses (an operator without an ONNX form): the module is run once more,
  eagerly, with every torch function it calls recorded with the module it runs in and the line of the
  user's code that calls it; the first call of the refused operator is named, with what would work.
* An error of the module's own code while it is traced (an spconv assertion, a shape error): its line.
* A value the tracer fixes into the model (`int(coors[-1, 0])`, a tensor turned into a Python number or
  list): torch's TracerWarning, with the user's line, becomes a SparseLowerWarning and a note in the
  model's import report: frames on which that value differs get the example's.
* A tensor's data copied out as an array while the module is traced (`.numpy()`, `.tolist()`), a model
  that reads none of its inputs, or one that lost an input while values were fixed (everything the module
  computed from it ran outside the trace): refused, with the lines (refuse_frozen).
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


def _fixed_values(caught, understood) -> list:
    """The tracer's warnings of values it fixed in the user's code (not torch's, the engines' or the export's
    own reading of constants), but those at the (file, line)s of `understood`, which no output depends on."""
    return [warning for warning in caught if issubclass(warning.category, torch.jit.TracerWarning)
            and not any(Path(warning.filename).is_relative_to(folder) for folder in LIBRARY_FOLDERS)
            and (warning.filename, warning.lineno) not in understood]


def _said(warning) -> str:
    """What a tracer warning says was fixed: its first sentence."""
    return str(warning.message).split(" might cause")[0].split(". ")[0]


_ARRAYS = ("Converting a tensor to a Python list", "Converting a tensor to a NumPy array")
_FIX = ("compute it with torch operations on the tensors (no .numpy() or .tolist() of them, no C++ extension "
        "between the inputs and the outputs); the export refuses what it would freeze")


def refuse_frozen(model: onnx.ModelProto, inputs: list[str], caught, understood=frozenset()) -> None:
    """Refuse what the trace froze from the example (docs/formats.md#sparse_lowerexport), whatever the check:
    * a tensor's data copied out as an array (`.numpy()`, `.tolist()`): a frame's data is never a constant,
      and whatever the module computes from the copy is the example's on every frame;
    * a model that reads none of its inputs, or that lost one while values were fixed: what the module
      computed from it ran outside the trace (a C++ extension, NumPy), and its outputs are the example's.
    An input the module never reads, with nothing fixed, is the module's choice: it is left out of the model.
    A number read from a tensor (`int(coors[-1, 0]) + 1`) stays a warning (note_frozen)."""
    fixed = _fixed_values(caught, understood)
    arrays = [w for w in fixed if _said(w).startswith(_ARRAYS)]
    if arrays:
        where = "; ".join(dict.fromkeys(f"{w.filename}:{w.lineno}" for w in arrays))
        raise SparseLowerError(f"the module copies a tensor's data out of torch while it is traced ({where}): "
                               "the trace fixes what it computes from the copy at the example's values", fix=_FIX)
    kept = {value.name for value in model.graph.input}
    lost = [name for name in inputs if name not in kept]
    if not lost or (kept and not fixed):
        return
    where = "; ".join(dict.fromkeys(f"{w.filename}:{w.lineno}: {_said(w)}" for w in fixed))
    said = "its outputs are constants: " if not kept else ""
    raise SparseLowerError(
        f"the exported model does not read its input{'s' if len(lost) > 1 else ''} {', '.join(map(repr, lost))}: "
        f"{said}what the module computes from {'them' if len(lost) > 1 else 'it'} ran outside the trace and was "
        f"fixed at the example's values" + (f" ({where})" if where else " (by code torch does not see: a C++ "
                                            "extension, or NumPy on a tensor's data)"), fix=_FIX)


def note_frozen(model: onnx.ModelProto, caught, understood=frozenset()) -> None:
    """The tracer's warnings of values it fixed, as SparseLowerWarnings and notes in the import report;
    but those at the (file, line)s of `understood`, which no output depends on."""
    notes = []
    for warning in _fixed_values(caught, understood):
        message = _said(warning)
        note = (f"{warning.filename}:{warning.lineno}: {message} fixes a value of the example into the model. "
                f"Where it changes from frame to frame and the outputs depend on it, compute it with torch operations")
        if note not in notes:
            notes.append(note)
    for note in notes:
        warnings.warn(note, SparseLowerWarning, stacklevel=4)  # the caller of export
    report = {"format": "torch", "notes": notes}
    model.metadata_props.append(onnx.StringStringEntryProto(key=IMPORT_KEY, value=json.dumps(report)))
