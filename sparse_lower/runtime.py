"""Run models that use the sparse_lower custom ops: where the library is, and sessions that load it.

This is the runtime glue: it imports nothing of the compiler, so a deployment needs only
this module, onnxruntime and the library.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import onnx
import onnxruntime as ort

LIBRARY_ENV = "SPARSE_LOWER_LIBRARY"
LIBRARY_NAME = "libsparse_lower_ops.so"
REGISTERED_KEY = "sparse_lower.library"  # a session config entry marking options the library is on


def get_library_path() -> str:
    """The path of the custom-op library: ``$SPARSE_LOWER_LIBRARY`` if set, else the one in the package."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"{LIBRARY_ENV}={override} is not a file; point it at a built {LIBRARY_NAME}")
        return str(path.resolve())
    # Every folder of the package: an editable install keeps the sources and the built library apart.
    folders = [Path(folder) for folder in sys.modules[__package__].__path__]
    path = next((folder / LIBRARY_NAME for folder in folders if (folder / LIBRARY_NAME).is_file()), None)
    if path is None:
        raise FileNotFoundError(
            f"the sparse_lower custom-op library is not built: no {LIBRARY_NAME} in {folders}. Install the package with "
            f"`pip install .` from the source tree (it compiles custom_ops/ with CMake), or build it with "
            f"`cmake -S . -B build && cmake --build build` and set {LIBRARY_ENV} to build/{LIBRARY_NAME}"
        )
    return str(path)


def register_library(options: ort.SessionOptions) -> ort.SessionOptions:
    """Register the library on `options` once: registering it twice on the same options makes
    onnxruntime refuse the next session ("Domain already set in registry"), and users reuse options."""
    path = get_library_path()
    try:
        registered = options.get_session_config_entry(REGISTERED_KEY)
    except RuntimeError:  # onnxruntime raises for a key that was never set
        registered = None
    if registered != path:
        options.register_custom_ops_library(path)
        options.add_session_config_entry(REGISTERED_KEY, path)
    return options


def create_session(model, **ort_kwargs) -> ort.InferenceSession:
    """An onnxruntime session of ``model`` (ModelProto, serialized bytes or path) with the library loaded.

    ``sess_options`` (registered on in place; a new SessionOptions when absent), ``providers`` (default
    CPU) and every other keyword go to ``onnxruntime.InferenceSession``.
    """
    options = ort_kwargs.pop("sess_options", None) or ort.SessionOptions()
    register_library(options)
    providers = ort_kwargs.pop("providers", None) or ["CPUExecutionProvider"]
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif isinstance(model, os.PathLike):
        model = os.fspath(model)
    return ort.InferenceSession(model, sess_options=options, providers=providers, **ort_kwargs)
