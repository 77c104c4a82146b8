"""Run lowered models: where the library is, sessions that load it, and what a portable model's NaN
outputs say about a frame.

This is the runtime glue: it imports nothing of the compiler, so a deployment needs only
this module, onnxruntime and the library.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
import warnings
from collections import Counter
from importlib import metadata
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime.capi.onnxruntime_pybind11_state as ort_state

from .errors import SparseLowerError, SparseLowerWarning
from .model_io import readable, recorded_options, unreadable
from .onnx_conventions import CUSTOM_DOMAIN, DEFAULT_DOMAIN_ALIAS, SOURCE_DOMAIN, STANDARD_DOMAINS

LIBRARY_ENV = "SPARSE_LOWER_LIBRARY"
LIBRARY_NAME = "libsparse_lower_ops.so"
# Built beside it where nvcc was found: the CPU kernels plus CUDA kernels for onnxruntime's CUDA
# execution provider, and the C ABI of custom_ops/cuda/abi.h (sparse_lower.cuda_kernels).
CUDA_LIBRARY_NAME = "libsparse_lower_cuda.so"
CUDA_LIBRARY_ENV = "SPARSE_LOWER_CUDA_LIBRARY"
# Always built: the CUDA kernels' bodies run on the host behind the same C ABI (their tests in CI).
EMULATED_LIBRARY_NAME = "libsparse_lower_emulated.so"
EMULATED_LIBRARY_ENV = "SPARSE_LOWER_EMULATED_LIBRARY"
CUDA_PROVIDER = "CUDAExecutionProvider"
REGISTERED_KEY = "sparse_lower.library"  # a session config entry marking options the library is on
ASSIGNMENT_KEY = "session.record_ep_graph_assignment_info"  # onnxruntime keeps its record of each node's provider


def get_library_path() -> str:
    """The path of the custom-op library: ``$SPARSE_LOWER_LIBRARY`` if set, else the one in the package."""
    path = _override(LIBRARY_ENV, LIBRARY_NAME) or _packaged_path(LIBRARY_NAME)
    if path is None:
        raise FileNotFoundError(_not_built(_package_folders()))
    return path


def vector_units() -> str:
    """The widest vector units the library's CPU kernels use on this machine. x86-64: "avx512-amx" (as
    "avx512-vnni", but int8 convs of 64 input channels or more by AMX tiles), "avx512-vnni" (the convs'
    products in AVX-512, int8 ones by vpdpbusd; the rest AVX2), "avx512" (the same without VNNI: int8 in
    AVX2) or "avx2" (AVX2 + FMA); aarch64: "neon-i8mm" (int8 by USMMLA), "neon-dotprod" (int8 by SDOT) or
    "neon" (float by FMLA, int8 portable); "portable" anywhere. The environment narrows them:
    SPARSE_LOWER_NO_AMX=1, SPARSE_LOWER_NO_AVX512=1, SPARSE_LOWER_NO_I8MM=1,
    SPARSE_LOWER_PORTABLE_KERNELS=1 (read once per process, at first use)."""
    library = ctypes.CDLL(get_library_path())
    library.SparseLowerVectorUnits.restype = ctypes.c_char_p
    return library.SparseLowerVectorUnits().decode()


def cuda_library_path() -> str | None:
    """The path of the CUDA build of the library (its CPU kernels, CUDA kernels for onnxruntime's CUDA
    execution provider and the C ABI of sparse_lower.cuda_kernels): ``$SPARSE_LOWER_CUDA_LIBRARY`` if set,
    else the package's, or None where none was built (the package was installed where no nvcc was found)."""
    return _override(CUDA_LIBRARY_ENV, CUDA_LIBRARY_NAME) or _packaged_path(CUDA_LIBRARY_NAME)


def emulated_library_path() -> str | None:
    """The path of the emulated library (the CUDA kernels' bodies on the host): ``$SPARSE_LOWER_EMULATED_LIBRARY``
    if set (tools/sanitize.sh points it at a sanitized build), else the package's, or None."""
    return _override(EMULATED_LIBRARY_ENV, EMULATED_LIBRARY_NAME) or _packaged_path(EMULATED_LIBRARY_NAME)


def _override(variable: str, name: str) -> str | None:
    """The library an environment variable names, checked; None where it is unset."""
    override = os.environ.get(variable)
    if not override:
        return None
    if not Path(override).is_file():
        raise FileNotFoundError(f"{variable}={override} is not a file; point it at a built {name}")
    return str(Path(override).resolve())


def _packaged_path(name: str) -> str | None:
    path = _packaged(name)
    return None if path is None else str(path)


def _package_folders() -> list[Path]:
    return [Path(folder) for folder in sys.modules[__package__].__path__]


def _packaged(name: str) -> Path | None:
    """A library built into the package: in a folder of the package (an editable install keeps the
    sources and the built libraries apart), else in the installed distribution, when the package was
    imported from elsewhere: Python run from a checkout root imports the source folder (which holds no
    build) before the package that `pip install .` installed from it, and the user expects what they
    installed to be used."""
    path = next((folder / name for folder in _package_folders() if (folder / name).is_file()), None)
    return path if path is not None else _installed(name)


def _installed(name: str) -> Path | None:
    """Library `name` of the installed distribution, or None."""
    try:
        path = Path(metadata.distribution("sparse-lower").locate_file(f"sparse_lower/{name}"))
    except metadata.PackageNotFoundError:
        return None
    return path if path.is_file() else None


def _not_built(folders: list[Path]) -> str:
    """Why there is no library, and the fix. Imported from a source tree with nothing installed, "install
    the package" is right but the user must also know which package Python is reading."""
    checkout = next((folder.parent for folder in folders
                     if (folder.parent / "pyproject.toml").is_file() and (folder.parent / "custom_ops").is_dir()), None)
    if checkout is not None and len(folders) == 1:
        return (f"sparse_lower was imported from its source tree {folders[0]}, which holds no built {LIBRARY_NAME}, "
                f"and no installed sparse-lower has one: install the checkout with `pip install {checkout}` (or "
                f"`pip install -e {checkout}` to work on it; either compiles the library)")
    return (f"the sparse_lower custom-op library is not built: no {LIBRARY_NAME} in {[str(f) for f in folders]}. "
            f"Install the package with `pip install .` from the source tree (it compiles custom_ops/ with CMake), "
            f"or build it with `cmake -S . -B build && cmake --build build` and set {LIBRARY_ENV} to "
            f"build/{LIBRARY_NAME}")


def register_library(options: ort.SessionOptions, path: str | None = None) -> ort.SessionOptions:
    """Register the library (`path`, by default get_library_path()) on `options` once: registering it twice
    on the same options makes onnxruntime refuse the next session ("Domain already set in registry"), and
    users reuse options."""
    path = path or get_library_path()
    try:
        registered = options.get_session_config_entry(REGISTERED_KEY)
    except RuntimeError:  # onnxruntime raises for a key that was never set
        registered = None
    if registered != path:
        options.register_custom_ops_library(path)
        options.add_session_config_entry(REGISTERED_KEY, path)
    return options


def needs_library(model: onnx.ModelProto) -> bool:
    """Whether a model holds the library's custom ops (it imports their domain); a portable model does not,
    nor an nna one lowered with standard tables."""
    return any(o.domain == CUSTOM_DOMAIN for o in model.opset_import)


BROKEN_FRAME = SparseLowerError(
    "the model's outputs are NaN, its inputs finite: the frame breaks a rule of sparse tensors (a coordinate outside "
    "the grid or negative, a negative batch index, duplicated coords, feature rows that do not pair with the coords; "
    "an nna model with standard tables: more rows than a capacity; a portable model: a frame whose grid would take "
    "more than 2 GiB, or, in its static form, more rows than max_active or a batch index past max_batch), which a "
    "model of standard ops only answers with NaN",
    fix="run the frame on the gpu target, or sparse_lower.reference, to have the row named (and "
        "`sparse-lower inspect MODEL --frames ...` for the capacities)")


def broken_frame(feeds: dict, outputs: list) -> bool:
    """Whether a model of standard ops only (portable, or nna with standard tables) says that the frame broke a
    rule of sparse tensors: its guards make every output feature NaN then (docs/portable.md), which a finite
    frame gives in no other way."""
    floats = [np.asarray(v) for v in feeds.values() if np.issubdtype(np.asarray(v).dtype, np.floating)]
    return all(np.isfinite(v).all() for v in floats) and any(
        np.isnan(o).any() for o in map(np.asarray, outputs) if np.issubdtype(o.dtype, np.floating))


# The log severity of the sessions made here (onnxruntime's: 2 warning, 3 error, 4 fatal). A refused run
# raises its error, naming the node, which onnxruntime's log would print again in red before the caller
# can word it: fatal only. The command line's -v sets 2 while it runs.
SESSION_LOG_SEVERITY = 4


def quiet_options() -> ort.SessionOptions:
    """Session options whose log keeps to SESSION_LOG_SEVERITY."""
    options = ort.SessionOptions()
    options.log_severity_level = SESSION_LOG_SEVERITY
    return options


def session_for(model: onnx.ModelProto, **ort_kwargs) -> ort.InferenceSession:
    """A session as the model needs it: with the library where it holds the custom ops (create_session),
    a plain onnxruntime session, no library registered, for a portable model."""
    if needs_library(model):
        return create_session(model, **ort_kwargs)
    ort_kwargs.setdefault("providers", ["CPUExecutionProvider"])
    ort_kwargs["sess_options"] = ort_kwargs.get("sess_options") or quiet_options()
    return ort.InferenceSession(model.SerializeToString(), **ort_kwargs)


def fixed_rows(model: onnx.ModelProto) -> bool:
    """Whether a model is the portable target's static form: inputs of fixed rows, padding rows −1."""
    options = recorded_options(model)
    return options.get("target") == "portable" and options.get("max_active") is not None


def pad_rows(model: onnx.ModelProto, feeds: dict) -> dict:
    """A frame's feeds as a model of the portable target's static form takes them: every 2-D input of a
    fixed row count padded to it, coords with rows of −1 (padding rows, which hold no site) and features
    with zeros. The feeds of any other model are returned as they are."""
    if not fixed_rows(model):
        return feeds
    padded = dict(feeds)
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        given = feeds.get(value.name)
        if given is None or len(dims) != 2 or not dims[0].HasField("dim_value") or np.ndim(given) != 2:
            continue
        rows, given = dims[0].dim_value, np.asarray(given)
        if len(given) > rows:
            raise SparseLowerError(f"'{value.name}' has {len(given):,} rows, more than the {rows:,} the model was "
                                   f"lowered for (max_active)", fix="lower the model with a larger max_active")
        fill = -1 if np.issubdtype(given.dtype, np.integer) else 0
        padded[value.name] = np.concatenate([given, np.full((rows - len(given), given.shape[1]), fill, given.dtype)])
    return padded


def drop_padding(outputs: dict) -> dict:
    """Outputs of the portable target's static form without their padding rows: the rows of every 2-D
    integer output (coords: int64, or int32 as Autoware's files give them) whose batch is −1, and the
    same rows of the float outputs of as many rows."""
    real = {len(v): np.asarray(v)[:, 0] != -1 for v in outputs.values()
            if np.issubdtype(np.asarray(v).dtype, np.integer) and np.ndim(v) == 2}
    return {name: np.asarray(v)[real[len(v)]] if np.ndim(v) == 2 and len(v) in real else v
            for name, v in outputs.items()}


def create_session(model, **ort_kwargs) -> ort.InferenceSession:
    """An onnxruntime session of ``model`` (ModelProto, serialized bytes or path) with the library loaded.

    ``sess_options`` (registered on in place; a new SessionOptions when absent), ``providers`` (default
    CPU) and every other keyword go to ``onnxruntime.InferenceSession``. With onnxruntime's CUDA execution
    provider among the providers (onnxruntime-gpu), the CUDA build of the library is loaded, whose CUDA
    kernels run the ops on the GPU (cuda_library_path()), and a custom op left on the CPU is warned of.
    Unless the CUDA provider's options name a ``user_compute_stream`` of their own, the session runs on
    the library's stream for its GPU with the input checks deferred: a run copies nothing back to the
    host but the sizes its outputs need, and a refused input raises SparseLowerError at the run's end,
    naming the op (CudaSession).
    """
    options = ort_kwargs.pop("sess_options", None) or quiet_options()
    providers = ort_kwargs.pop("providers", None) or ["CPUExecutionProvider"]
    library = _library_for(providers)
    register_library(options, library)
    stream = None
    if _asks_for_cuda(providers):
        options.add_session_config_entry(ASSIGNMENT_KEY, "1")
        if CUDA_PROVIDER in ort.get_available_providers() and "provider_options" not in ort_kwargs:
            providers, stream = _on_library_stream(providers, library)
    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif isinstance(model, (str, os.PathLike)):
        model = readable(os.fspath(model))
    elif not isinstance(model, bytes):
        raise SparseLowerError(f"the model is of type {type(model).__name__}",
                               fix="give an onnx.ModelProto, its serialized bytes or the path of an .onnx file")
    try:
        if stream is None:
            session = ort.InferenceSession(model, sess_options=options, providers=providers, **ort_kwargs)
        else:
            session = CudaSession(model, stream, sess_options=options, providers=providers, **ort_kwargs)
    except (ort_state.Fail, ort_state.InvalidGraph, ort_state.NotImplemented) as error:
        unlowered = _not_lowered(model)
        if unlowered is None:
            raise
        what, fix = unlowered
        raise SparseLowerError(f"{what}: onnxruntime cannot run it ({error})", fix=fix) from error
    except (ort_state.InvalidProtobuf, ort_state.NoSuchFile) as error:
        if isinstance(model, str):
            raise unreadable(model) from error
        raise SparseLowerError(f"the model bytes are no ONNX model ({error})",
                               fix="give the bytes of a serialized onnx.ModelProto") from error
    if CUDA_PROVIDER in session.get_providers():
        _warn_of_custom_ops_off(session, CUDA_PROVIDER)
    return session


class _Stream:
    """A stream of the CUDA library (its address), a lock that keeps one run at a time on it (the checks of
    a stream report the first refusal since the last report: two runs at once would mix theirs), and the
    library's C ABI."""

    def __init__(self, library: str, device: int):
        self.abi = ctypes.CDLL(library)  # the handle onnxruntime loaded: the same checks
        self.lock = threading.Lock()
        error, pointer = ctypes.create_string_buffer(_ERROR_SIZE), ctypes.c_void_p()
        if self.abi.sl_new_stream(ctypes.c_int32(device), ctypes.byref(pointer), error, ctypes.c_int64(_ERROR_SIZE)):
            raise SparseLowerError(f"no CUDA stream on GPU {device}: {error.value.decode()}")
        self.address = pointer.value or 0
        self.abi.sl_defer_checks(ctypes.c_void_p(self.address), ctypes.c_int32(1))

    def report(self) -> None:
        """Raises the first input refused on the stream since the last report."""
        error = ctypes.create_string_buffer(_ERROR_SIZE)
        if self.abi.sl_report(ctypes.c_void_p(self.address), error, ctypes.c_int64(_ERROR_SIZE)):
            raise SparseLowerError(error.value.decode(), fix="correct the frame (docs/custom_ops.md says what each op "
                                                              "checks)")


_ERROR_SIZE = 4096
_STREAMS: dict[tuple[str, int], _Stream] = {}
_STREAMS_LOCK = threading.Lock()


def _on_library_stream(providers: list, library: str) -> tuple[list, _Stream | None]:
    """`providers` with the CUDA provider on the library's stream for its GPU (one per GPU, shared by the
    sessions there), and that stream; as given, and None, where the CUDA provider's options name a stream."""
    out, stream = [], None
    for provider in providers:
        name = provider_name(provider)
        given = dict(provider[1]) if isinstance(provider, (tuple, list)) else {}
        if name == CUDA_PROVIDER and "user_compute_stream" not in given:
            device = int(given.get("device_id", 0))
            with _STREAMS_LOCK:
                if (library, device) not in _STREAMS:
                    _STREAMS[library, device] = _Stream(library, device)
                stream = _STREAMS[library, device]
            given.update(user_compute_stream=str(stream.address), has_user_compute_stream="1")
            provider = (name, given)
        out.append(provider)
    return out, stream


class CudaSession(ort.InferenceSession):
    """A session on onnxruntime's CUDA provider whose custom ops defer their input checks to the end of
    each run (create_session makes it): the checks' verdicts stay on the GPU, and after the run the first
    refused input raises SparseLowerError with the op's message and node. Runs on one GPU go one at a time
    (they share the library's stream); give the CUDA provider a ``user_compute_stream`` of your own for
    sessions that run at once (their ops then check and report one by one)."""

    def __init__(self, model, stream: _Stream, **kwargs):
        super().__init__(model, **kwargs)
        self._stream = stream

    def _reported(self, run, *args, **kwargs):
        with self._stream.lock:
            try:
                result = run(*args, **kwargs)
            except Exception:
                self._stream.report()  # a refusal recorded before the op that failed is the one to name
                raise
            self._stream.report()
            return result

    def run(self, *args, **kwargs):
        return self._reported(super().run, *args, **kwargs)

    def run_with_iobinding(self, *args, **kwargs):
        return self._reported(super().run_with_iobinding, *args, **kwargs)

    def run_with_ort_values(self, *args, **kwargs):
        return self._reported(super().run_with_ort_values, *args, **kwargs)


def placement(session: ort.InferenceSession) -> dict[str, list[tuple[str, str, str]]]:
    """{provider: [(domain, op_type, node name), ...]}: where onnxruntime placed each node, from its own record
    (kept for a session created with ``session.record_ep_graph_assignment_info`` = "1", as create_session
    does whenever the CUDA provider is asked for)."""
    placed: dict[str, list[tuple[str, str, str]]] = {}
    for part in session.get_provider_graph_assignment_info():
        placed.setdefault(part.ep_name, []).extend((n.domain, n.op_type, n.name) for n in part.get_nodes())
    return placed


def custom_ops_off(session: ort.InferenceSession, provider: str) -> list[tuple[str, str]]:
    """(op_type, node name) of every custom op of the library that onnxruntime did not place on `provider`."""
    return sorted((op_type, name) for ep, nodes in placement(session).items() if ep != provider
                  for domain, op_type, name in nodes if domain == CUSTOM_DOMAIN)


def _warn_of_custom_ops_off(session: ort.InferenceSession, provider: str) -> None:
    """Says which custom ops run on the CPU of a session on `provider`: onnxruntime would copy their inputs
    to the host and back without a word (the ops the CUDA library has no kernel for: the nna target's
    index builders, the gpu target's rulebook form)."""
    off = custom_ops_off(session, provider)
    if off:
        counts = Counter(op for op, _ in off)
        warnings.warn(SparseLowerWarning(
            f"{len(off)} custom op(s) run on the CPU, not on {provider}, their inputs copied to the host and back: "
            + ", ".join(f"{op} x{n}" for op, n in counts.items())
            + " (the CUDA library has no kernel for them; the gpu target's default form has one for every op)"),
            stacklevel=3)


def provider_name(provider) -> str:
    """The name of a provider as onnxruntime takes it: a name, or a (name, options) pair."""
    return provider[0] if isinstance(provider, (tuple, list)) else provider


def _asks_for_cuda(providers: list) -> bool:
    """Whether onnxruntime's CUDA provider is among `providers`."""
    return any(provider_name(p) == CUDA_PROVIDER for p in providers)


def _library_for(providers: list) -> str:
    """The CUDA library where onnxruntime's CUDA provider is asked for, else the CPU one."""
    if not _asks_for_cuda(providers):
        return get_library_path()
    path = cuda_library_path()
    if path is None:
        raise FileNotFoundError(f"{CUDA_PROVIDER} was asked for, but the package holds no {CUDA_LIBRARY_NAME}: install "
                                f"it where CUDA's nvcc is found (pip install .; SPARSE_LOWER_CUDA=ON makes that a "
                                f"requirement of the build)")
    return path


# The exporters' conv ops (the importers' signatures, spelled out: this module imports nothing of the compiler)
_FOREIGN_OPS = {("", "SparseConvolution"), ("spconv", "SparseConvolution"), ("autoware", "ImplicitGemm"),
                ("autoware", "IndiceConv")}


# What onnxruntime raises when a model or its inputs are refused at session creation or run time
# (a coordinate outside the grid, a capacity exceeded, a width the model does not take, …)
RUNTIME_ERRORS = tuple(getattr(ort_state, name) for name in ("Fail", "InvalidArgument", "InvalidGraph",
                                                             "RuntimeException", "NoSuchFile"))
_NODE_FAILURE = re.compile(r"while running \w+ node\. Name:'(?P<node>[^']*)' Status Message: (?P<message>.*)", re.S)
_WRAPPER = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ")
# fixes for the library's run-time refusals that do not carry their own
_FIXES = (("outside the grid", "voxelize the frame on the grid the model was built for: coords are the batch index, "
                               "then one index per grid axis; for a model from sparse_lower.export, whose grid is "
                               "computed from the frame, that grid is a bound: export it again with a larger "
                               "max_spatial_shape"),
          ("twice", "give each site one row: merge the voxels that share a site"))


def runtime_refusal(error: Exception) -> SparseLowerError | str:
    """onnxruntime's refusal without its wrapper (`[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : …`): a custom
    op's own message as a SparseLowerError naming its node, with a fix where the message has none; any
    other refusal as onnxruntime's text."""
    text = str(error)
    failed = _NODE_FAILURE.search(text)
    if failed is None:
        return _WRAPPER.sub("", text).strip()
    message = failed["message"].strip()
    fix = None if "fix:" in message else next((fix for words, fix in _FIXES if words in message), None)
    return SparseLowerError(message, node=failed["node"], fix=fix)


def _not_lowered(model: bytes | str) -> tuple[str, str] | None:
    """(what, fix) when a model onnxruntime refused was never lowered: it holds sparse_lower's source ops,
    or a sparse-conv exporter's ops (which `import_model` reads). A second look, only after a failure."""
    try:
        proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(model, load_external_data=False)
    except Exception:  # not even ONNX: onnxruntime's own error says more
        return None
    ops = sorted({f"{n.domain}::{n.op_type}" for n in proto.graph.node if n.domain == SOURCE_DOMAIN})
    if ops:
        return (f"the model holds sparse_lower's source ops ({', '.join(ops)}), not their lowered form",
                "lower it first: sparse_lower.lower(model, target='gpu'), or `sparse-lower convert`")
    foreign = sorted({f"{n.domain or DEFAULT_DOMAIN_ALIAS}::{n.op_type}" for n in proto.graph.node
                      if ("" if n.domain in STANDARD_DOMAINS else n.domain, n.op_type) in _FOREIGN_OPS})
    if foreign:
        return (f"the model is a sparse-conv exporter's file ({', '.join(foreign)})",
                "import and lower it first: sparse_lower.lower(sparse_lower.import_model(model), target='gpu'), "
                "or `sparse-lower convert`")
    return None
