"""Frames on disk: which files a job reads, how a frame feeds a model, and how outputs are written.

A frame is an `.npz` with the voxels of one LiDAR sweep: `features [N, C]` and `coords [N, 1 + D]`
(batch index first), the keys of the nuScenes frames the project ships with; other keys are ignored
unless a model input has their name. Outputs go to one `.npz` per frame, named after the frame, and
appear whole or not at all: a job stopped half-way (a crash, Ctrl-C, a full disk) leaves no truncated
file that a later evaluation would read as a result.
"""

from __future__ import annotations

import os
import uuid
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from ..errors import SparseLowerError
from ..input_roles import input_grids
from ..model_io import fed_inputs
from ..verify import cast_feed, given_inputs

FRAME_SUFFIX = ".npz"
FEATURES_KEY, COORDS_KEY, SPATIAL_SHAPE_KEY = "features", "coords", "spatial_shape"


def find_frames(paths) -> list[Path]:
    """The frame files of `paths` (files, or folders whose `*.npz` are taken, not recursively), in the
    order given and sorted within a folder. Frames that would write the same output name are refused
    now, before hours of work, not discovered when the second overwrites the first."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]  # one file or folder, not its characters
    paths = list(paths) if isinstance(paths, Iterable) and not isinstance(paths, Mapping) else [paths]
    for position, given in enumerate(paths):
        if not isinstance(given, (str, os.PathLike)):
            raise SparseLowerError(f"frame {position} is of type {type(given).__name__}, where a path to an "
                                   f"{FRAME_SUFFIX} file or a folder of them goes",
                                   fix=f"save frames with numpy.savez(path, {FEATURES_KEY}=..., {COORDS_KEY}=...) "
                                       "and give their paths")
    frames: list[Path] = []
    for given in map(Path, paths):
        if given.is_dir():
            found = sorted(given.glob(f"*{FRAME_SUFFIX}"))
            if not found:
                raise SparseLowerError(f"the folder {given} holds no {FRAME_SUFFIX} frames",
                                       fix=f"give {FRAME_SUFFIX} files with 'features' and 'coords', or a folder of them")
            frames += found
        elif given.is_file():
            frames.append(given)
        else:
            raise SparseLowerError(f"frame {given}: no such file or folder", fix="check the path")
    if not frames:
        raise SparseLowerError("no frames given", fix=f"give {FRAME_SUFFIX} files or folders of them")
    seen: dict[str, Path] = {}
    for frame in frames:
        other = seen.setdefault(frame.stem, frame)
        if other != frame:
            raise SparseLowerError(f"the frames {other} and {frame} would both write {frame.stem}{FRAME_SUFFIX}",
                                   fix="give frames with distinct file names, or run the folders as separate jobs")
    if len(set(seen.values())) != len(frames):
        raise SparseLowerError("a frame is given twice", fix="give each frame once")
    return frames


def output_paths(frames: list[Path], out_dir: Path) -> list[Path]:
    """Where each frame's outputs go: `out_dir/<frame name>.npz`. A job whose outputs would replace its
    own frames (OUT_DIR = the frames' folder) is refused."""
    outputs = [out_dir / f"{frame.stem}{FRAME_SUFFIX}" for frame in frames]
    for frame, output in zip(frames, outputs):
        if output.resolve() == frame.resolve():
            raise SparseLowerError(f"the output of {frame} would overwrite the frame itself",
                                   fix="give an output folder other than the frames' folder")
    return outputs


@dataclass(frozen=True)
class ModelInput:
    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...] | None = None  # the declared dims (None: symbolic), None: no shape declared
    grid: tuple[int, ...] | None = None  # a coordinate input's grid


def model_inputs(model: onnx.ModelProto) -> list[ModelInput]:
    """The graph inputs a run feeds, with their element types, declared shapes and (coordinates) grids."""
    grids = input_grids(model)

    def shape(value: onnx.ValueInfoProto):
        if not value.type.tensor_type.HasField("shape"):
            return None
        return tuple(d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim)

    return [ModelInput(v.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)),
                       shape(v), tuple(grids[v.name]) if v.name in grids else None) for v in fed_inputs(model)]


def _kind(dtype: np.dtype) -> str:
    return "integer" if np.issubdtype(dtype, np.integer) else "float" if np.issubdtype(dtype, np.floating) else str(dtype)


def frame_feeds(frame: dict[str, np.ndarray], inputs: list[ModelInput]) -> dict[str, np.ndarray]:
    """The model's feeds from a frame's arrays. A key named like an input feeds it; then `features` feeds
    the one float input left and `coords` the one integer input left, so that a model whose inputs are
    called e.g. `voxels` and `indices` reads the frames as they are. Arrays are cast to the input's type
    as `--inputs` files are (verify.cast_feed: float16 features to float32, int32 coords to int64); a
    float array for an integer input, the reverse, or an integer cast that changes values is refused."""
    feeds = {i.name: frame[i.name] for i in inputs if i.name in frame}
    keys = {name: name for name in feeds}  # which of the frame's arrays feeds each input
    for key, kind in ((FEATURES_KEY, "float"), (COORDS_KEY, "integer")):
        left = [i for i in inputs if i.name not in feeds and _kind(i.dtype) == kind]
        if key in frame and key not in feeds and len(left) == 1:
            feeds[left[0].name], keys[left[0].name] = frame[key], key
    missing = [i.name for i in inputs if i.name not in feeds]
    if missing:
        raise SparseLowerError(f"nothing in the frame feeds the model input(s) {', '.join(missing)}; the frame has "
                               f"{', '.join(sorted(frame)) or 'no arrays'}",
                               fix=f"store '{FEATURES_KEY}' and '{COORDS_KEY}', or arrays named like the model's inputs")
    for model_input in inputs:
        value = feeds[model_input.name]
        _check_fits(keys[model_input.name], value, model_input, frame.get(SPATIAL_SHAPE_KEY))
        feeds[model_input.name] = cast_feed(value, model_input.dtype)
        if feeds[model_input.name] is None:
            raise SparseLowerError(f"the array for input '{model_input.name}' is {value.dtype}, the input takes "
                                   f"{model_input.dtype}, and casting would change its values",
                                   fix=f"store {_kind(model_input.dtype)} values for it, as {model_input.dtype}")
    return feeds


def _check_fits(key: str, value: np.ndarray, model_input: ModelInput, spatial_shape) -> None:
    """Refuse, in words, an array whose width the model does not take, and a frame whose declared grid is
    not the one the model reads its coordinates on (onnxruntime would only name the dimension index, and
    would run coordinates voxelized on another grid as if they were on the model's)."""
    grid = model_input.grid
    if model_input.shape is not None and key in (FEATURES_KEY, COORDS_KEY) and len(model_input.shape) == 2:
        width = model_input.shape[1]
        what, short = (("feature values per voxel", "feature values") if key == FEATURES_KEY else
                       ("columns per voxel (the batch index, then one coordinate per grid axis)", "columns"))
        if value.ndim != 2:
            raise SparseLowerError(f"the frame's '{key}' has {value.ndim} dimensions; the model's input "
                                   f"'{model_input.name}' takes [N, {width}]: {width} {what}",
                                   fix=f"store '{key}' as an [N, {width}] array, a row per voxel")
        if width is not None and value.shape[1] != width:
            raise SparseLowerError(f"the frame's '{key}' has {value.shape[1]} {short} per voxel; the model's input "
                                   f"'{model_input.name}' takes [N, {width}]: {width} {what}",
                                   fix=f"give frames with {width} {short}, or use a model built for {value.shape[1]}")
    if grid is not None and spatial_shape is not None:
        declared = [int(v) for v in np.ravel(spatial_shape)]
        if declared != list(grid):
            raise SparseLowerError(
                f"the frame declares spatial_shape {declared}; the model reads '{model_input.name}' on the grid "
                f"{list(grid)}", fix=f"voxelize the frame on the grid {list(grid)}, or use a model built for "
                                     f"{declared}")


_ZIP_MAGIC = b"PK\x03\x04"


def read_frame(path: Path) -> dict[str, np.ndarray]:
    """Every array of the frame file, read now (an `.npz` is read lazily otherwise, and a damaged member
    would fail later, inside the run). A file that is not a zip archive is refused as such: numpy would
    take it for a pickle and say so, which misleads."""
    fix = "write frames with numpy.savez(path, features=..., coords=...)"
    path = Path(path)
    if not path.exists():
        raise SparseLowerError("no such file", fix="check the path")
    if path.is_dir():
        raise SparseLowerError("a folder, not an .npz file", fix="give the .npz file (run takes folders of them)")
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as stream:
            damaged = stream.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC
        raise SparseLowerError("a damaged or truncated .npz archive" if damaged else
                               "not an .npz archive (another format, or empty)", fix=fix)
    try:
        with np.load(path, allow_pickle=False) as data:
            return {key: data[key] for key in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as error:
        raise SparseLowerError(f"a damaged or truncated .npz archive ({error})", fix=fix) from error


def read_frames(paths, folders: bool = True) -> list[tuple[Path, dict[str, np.ndarray]]]:
    """Every frame of `paths` (files, or with `folders` folders as find_frames takes them) read now, before
    any work that would be lost to an unreadable one; a bad frame is refused with its path."""
    frames = []
    for path in find_frames(paths) if folders else map(Path, paths):
        try:
            frames.append((path, read_frame(path)))
        except SparseLowerError as error:
            raise SparseLowerError(f"frame {path}: {error.reason}", fix=error.fix) from error
    return frames


def feeds_given(model: onnx.ModelProto, frames, what: str = "frames") -> list[dict[str, np.ndarray]]:
    """`frames` as a list of feeds of `model`, as a user gives them to the Python API: a list of feeds
    (dicts of input name to array), one such dict, or `.npz` frames (a path, a folder, or a list of them),
    read and fed as `run` feeds them (feeds_of). Anything else is refused naming what it is: a path is
    never read character by character."""
    if isinstance(frames, (str, os.PathLike, Mapping)):
        frames = [frames]
    elif isinstance(frames, np.ndarray) or not isinstance(frames, Iterable):
        raise SparseLowerError(f"{what} is of type {type(frames).__name__}",
                               fix="give a list of feeds ({input name: array}), or .npz frame files or folders")
    frames = list(frames)
    if frames and all(isinstance(frame, (str, os.PathLike)) for frame in frames):
        return feeds_of(model, read_frames(frames))
    for position, frame in enumerate(frames):
        if not isinstance(frame, Mapping):
            raise SparseLowerError(f"{what}[{position}] is of type {type(frame).__name__}",
                                   fix="give every frame as feeds ({input name: array}), or every one as an .npz "
                                       "path")
    return [given_inputs(model, dict(frame), f"{what}[{position}]") for position, frame in enumerate(frames)]


def feeds_of(model: onnx.ModelProto, frames: list[tuple[Path, dict[str, np.ndarray]]]) -> list[dict[str, np.ndarray]]:
    """The frames' arrays as feeds of `model` (frame_feeds); a frame that does not feed it is refused
    with its path."""
    inputs = model_inputs(model)
    feeds = []
    for path, frame in frames:
        try:
            feeds.append(frame_feeds(frame, inputs))
        except SparseLowerError as error:
            raise SparseLowerError(f"frame {path}: {error.reason}", fix=error.fix) from error
    return feeds


def write_outputs(path: Path, outputs: dict[str, np.ndarray], compress: bool = False) -> None:
    """Write `outputs` to `path` whole: into a hidden file of the same folder (named uniquely, since several
    workers write into one folder; created with the user's umask like any file), renamed over `path`
    only when complete (a rename within a folder is atomic)."""
    save = np.savez_compressed if compress else np.savez
    partial = path.with_name(f".{path.stem}.{uuid.uuid4().hex}.part")
    try:
        with open(partial, "xb") as stream:
            save(stream, **outputs)
        os.replace(partial, path)
    except BaseException as error:
        partial.unlink(missing_ok=True)
        # Ctrl-C inside the zip writer can surface as the error its clean-up raises next ("seek of closed
        # file"), the KeyboardInterrupt only its context: a frame's failure to the caller, and the
        # interrupt lost. The interrupt is what happened.
        interrupt = error
        while interrupt is not None and not isinstance(interrupt, KeyboardInterrupt):
            interrupt = interrupt.__context__
        if interrupt is not None and interrupt is not error:
            raise interrupt from None
        raise
