"""The gpu target's kernels called directly, through the C ABI of custom_ops/cuda/abi.h (ctypes), without
onnxruntime: in the CUDA library on device arrays (CuPy), or in the emulated library on NumPy arrays,
where the same kernel bodies run on the host.

Each method mirrors one custom op (docs/custom_ops.md) and takes its attributes by name, as the node
holds them. Arrays are given and returned in the library's memory: `Kernels.cuda()` takes and returns
CuPy arrays on the current device (run on CuPy's current stream), `Kernels.emulated()` NumPy arrays. A
refused input raises SparseLowerError with the CPU library's message.

    kernels = Kernels.emulated()
    nbr = kernels.submanifold_map(coords, kernel_shape=[3, 3, 3], spatial_shape=[41, 1440, 1440])
"""

from __future__ import annotations

import ctypes
from math import prod

import numpy as np

from .errors import SparseLowerError
from .runtime import cuda_library_path, emulated_library_path
from .schemas import ConvGeometry

_ERROR_SIZE = 2048
_TOO_SMALL = 2  # the ABI's "more rows than the capacity given"
_PRODUCTS = {"float32": 0, "float16": 1, "bfloat16": 2}  # sl_indexed_conv's `half`
_GEOMETRY_OPS = {"SubmanifoldMap": "SubmanifoldConv", "StridedMap": "SparseConv", "TransposedMap": "SparseDeconv",
                 "TargetMap": "SparseDeconv"}


class SlAxis(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in ("kernel", "stride", "pad", "dilation", "in_extent", "out_extent")]


class SlMapShape(ctypes.Structure):
    _fields_ = [("dims", ctypes.c_int32), ("transposed", ctypes.c_int32), ("axis", SlAxis * 3)]


def map_shape(op_type: str, **attributes) -> SlMapShape:
    """The geometry of map builder `op_type` from its attributes (the extents as schemas.ConvGeometry
    computes them for the source op it lowers)."""
    n = len(attributes["spatial_shape"])
    strided_targets = op_type == "TargetMap" and not attributes.get("transposed", 1)  # the floor rule's table
    source_op = "SparseConv" if strided_targets else _GEOMETRY_OPS[op_type]
    geometry = ConvGeometry(op_type=source_op, kernel_shape=tuple(attributes["kernel_shape"]),
                            strides=tuple(attributes.get("strides", (1,) * n)),
                            pads=tuple(attributes.get("pads", (0,) * (2 * n))),
                            dilations=tuple(attributes.get("dilations", (1,) * n)),
                            spatial_shape=tuple(attributes["spatial_shape"]),
                            output_padding=tuple(attributes.get("output_padding", (0,) * n)))
    shape = SlMapShape(dims=n, transposed=int(geometry.op_type == "SparseDeconv"))
    submanifold = op_type == "SubmanifoldMap"
    for d in range(n):
        kernel, dilation = geometry.kernel_shape[d], geometry.dilations[d]
        shape.axis[d] = SlAxis(kernel, 1 if submanifold else geometry.strides[d],
                               (kernel - 1) // 2 * dilation if submanifold else geometry.pads[d], dilation,
                               geometry.spatial_shape[d], geometry.output_shape[d])
    return shape


class Kernels:
    """The C ABI of one library, over the array module that holds its memory (numpy or cupy)."""

    def __init__(self, path: str, xp):
        self.library = ctypes.CDLL(path)
        self.library.sl_backend.restype = ctypes.c_char_p
        self.backend = self.library.sl_backend().decode()
        self.xp = xp

    @classmethod
    def emulated(cls) -> "Kernels":
        path = emulated_library_path()
        if path is None:
            raise SparseLowerError("the emulated kernel library is not built", fix="install the package (pip install .)")
        return cls(path, np)

    @classmethod
    def cuda(cls) -> "Kernels":
        import cupy

        path = cuda_library_path()
        if path is None:
            raise SparseLowerError("the CUDA library is not built",
                                   fix="install the package where nvcc is found (SPARSE_LOWER_CUDA=ON insists)")
        return cls(path, cupy)

    # -- plumbing -------------------------------------------------------------------------------------------

    def _pointer(self, array) -> ctypes.c_void_p:
        if array is None:
            return ctypes.c_void_p(None)
        if self.xp is np:
            return ctypes.c_void_p(array.ctypes.data)
        return ctypes.c_void_p(array.data.ptr)

    def _stream(self) -> ctypes.c_void_p:
        return ctypes.c_void_p(None if self.xp is np else self.xp.cuda.get_current_stream().ptr)

    def _array(self, value, dtype):
        """`value` as a contiguous array of the library's memory; None (an absent optional input) as it is."""
        return None if value is None else self.xp.ascontiguousarray(self.xp.asarray(value, dtype=dtype))

    def _call(self, name: str, *args) -> int:
        error = ctypes.create_string_buffer(_ERROR_SIZE)
        status = getattr(self.library, name)(self._stream(), *args, error, ctypes.c_int64(_ERROR_SIZE))
        if status == 1:
            raise SparseLowerError(error.value.decode(), name)
        return status

    def _counted(self, name: str, allocate, *args):
        """Calls a function whose output row count depends on the data: once to learn the count with
        no room, then with outputs of that many rows (allocate(count) -> their arrays)."""
        count = ctypes.c_int64(0)
        outputs = allocate(0)
        if self._call(name, *args, ctypes.c_int64(0), ctypes.byref(count), *map(self._pointer, outputs)) == _TOO_SMALL:
            outputs = allocate(count.value)
            self._call(name, *args, ctypes.c_int64(count.value), ctypes.byref(count), *map(self._pointer, outputs))
        return outputs

    # -- input checks ---------------------------------------------------------------------------------------

    def defer_checks(self, on: bool = True) -> None:
        """With `on`, the ops on the current stream leave their input checks' verdicts on the device and
        read back nothing but output sizes; report() then raises the first refusal. Off (the default),
        each op raises its own."""
        self.library.sl_defer_checks(self._stream(), ctypes.c_int32(on))

    def report(self) -> None:
        """Raises the first input refused on the current stream since the last report (deferred checks),
        with the message the op would have raised; nothing when all were right."""
        self._call("sl_report")

    # -- the ops --------------------------------------------------------------------------------------------

    def submanifold_map(self, coords, source: str = "rows", **attributes):
        shape = map_shape("SubmanifoldMap", **attributes)
        coords = self._array(coords, np.int64)
        nbr = self.xp.empty((len(coords), prod(attributes["kernel_shape"])), np.int64)
        self._call("sl_submanifold_map", ctypes.byref(shape), self._pointer(coords), ctypes.c_int64(len(coords)),
                   ctypes.c_int32(source == "dense"), self._pointer(nbr))
        return nbr

    def reached_map(self, op_type: str, coords, source: str = "rows", **attributes):
        """StridedMap or TransposedMap: (out_coords, nbr)."""
        shape = map_shape(op_type, **attributes)
        coords = self._array(coords, np.int64)
        taps, width = prod(attributes["kernel_shape"]), coords.shape[1]
        return self._counted("sl_reached_map",
                             lambda m: (self.xp.empty((m, width), np.int64), self.xp.empty((m, taps), np.int64)),
                             ctypes.byref(shape), self._pointer(coords), ctypes.c_int64(len(coords)),
                             ctypes.c_int32(source == "dense"))

    def target_map(self, coords, target_coords, source: str = "rows", **attributes):
        shape = map_shape("TargetMap", **attributes)
        coords, targets = self._array(coords, np.int64), self._array(target_coords, np.int64)
        nbr = self.xp.empty((len(targets), prod(attributes["kernel_shape"])), np.int64)
        self._call("sl_target_map", ctypes.byref(shape), self._pointer(coords), ctypes.c_int64(len(coords)),
                   self._pointer(targets), ctypes.c_int64(len(targets)), ctypes.c_int32(source == "dense"),
                   self._pointer(nbr))
        return nbr

    def site_index(self, coords, spatial_shape, batch_size: int):
        coords = self._array(coords, np.int64)
        extent = (ctypes.c_int64 * 3)(*spatial_shape)
        sites = self.xp.empty(len(coords), np.int64)
        self._call("sl_site_index", ctypes.c_int32(len(spatial_shape)), extent, ctypes.c_int64(batch_size),
                   self._pointer(coords), ctypes.c_int64(len(coords)), self._pointer(sites))
        return sites

    def site_order(self, coords, spatial_shape):
        """SiteOrder: (out_coords [N, 1 + D], order [N, 1], rank [N, 1])."""
        coords = self._array(coords, np.int64)
        extent = (ctypes.c_int64 * 3)(*spatial_shape)
        outputs = (self.xp.empty(coords.shape, np.int64), self.xp.empty((len(coords), 1), np.int64),
                   self.xp.empty((len(coords), 1), np.int64))
        self._call("sl_site_order", ctypes.c_int32(len(spatial_shape)), extent, self._pointer(coords),
                   ctypes.c_int64(len(coords)), *map(self._pointer, outputs))
        return outputs

    def active_sites(self, x):
        """(coords [N, 1 + D], sites [N, 1]) of a dense x [B, C, *S]."""
        x = self._array(x, np.float32)
        dims = x.ndim - 2
        extent = (ctypes.c_int64 * 3)(*x.shape[2:])
        return self._counted("sl_active_sites",
                             lambda n: (self.xp.empty((n, 1 + dims), np.int64), self.xp.empty((n, 1), np.int64)),
                             self._pointer(x), ctypes.c_int64(x.shape[0]), ctypes.c_int64(x.shape[1]),
                             ctypes.c_int32(dims), extent)

    def coalesce_map(self, coords, spatial_shape, members: int = 0):
        """CoalesceMap: (out_coords [M, 1 + D], members [M, R]) of coords whose rows may repeat a site."""
        coords = self._array(coords, np.int64)
        extent = (ctypes.c_int64 * 3)(*spatial_shape)
        count, width = ctypes.c_int64(0), ctypes.c_int64(0)

        def call(rows: int):
            outputs = (self.xp.empty((rows, coords.shape[1]), np.int64), self.xp.empty((rows, width.value), np.int64))
            status = self._call("sl_coalesce_map", ctypes.c_int32(len(spatial_shape)), extent, self._pointer(coords),
                                ctypes.c_int64(len(coords)), ctypes.c_int64(members), ctypes.c_int64(rows),
                                ctypes.byref(count), ctypes.byref(width), *map(self._pointer, outputs))
            return status, outputs

        status, outputs = call(0)  # learns the rows and the columns, as _counted learns the rows
        if status == _TOO_SMALL:
            status, outputs = call(count.value)
        return outputs

    def unfold(self, x, idx):
        """IndexedUnfold of rows x [N, C] or a dense x [B, C, *S]: y [..., K·C]."""
        x, idx = self._array(x, np.float32), self._array(idx, np.int64)
        dense = x.ndim > 2
        volume = prod(x.shape[2:]) if dense else 1
        taps, channels = idx.shape[-1], x.shape[1]
        rows = idx.size // max(taps, 1)
        y = self.xp.empty((*idx.shape[:-1], taps * channels), np.float32)
        self._call("sl_unfold", self._pointer(x), ctypes.c_int64(x.shape[0] * volume), ctypes.c_int64(channels),
                   ctypes.c_int32(dense), ctypes.c_int64(volume), self._pointer(idx), ctypes.c_int64(rows),
                   ctypes.c_int64(taps), self._pointer(y))
        return y

    def fold(self, rows, idx, like_rows: int | None = None, init=None, spatial_shape=None, batch_size=None):
        """IndexedFold: mode "rows" (like_rows targets, from init) or, with spatial_shape and batch_size, "dense"."""
        rows, idx = self._array(rows, np.float32), self._array(idx, np.int64)
        channels = rows.shape[-1]
        dense = spatial_shape is not None
        volume = prod(spatial_shape) if dense else 1
        targets = batch_size * volume if dense else like_rows
        shape = (batch_size, channels, *spatial_shape) if dense else (like_rows, channels)
        init = self._array(init, np.float32)
        y = self.xp.empty(shape, np.float32)
        self._call("sl_fold", self._pointer(rows), self._pointer(idx), ctypes.c_int64(idx.size),
                   ctypes.c_int64(channels), ctypes.c_int64(targets), ctypes.c_int32(dense), ctypes.c_int64(volume),
                   self._pointer(init), ctypes.c_int32(init is not None and init.ndim == 2), self._pointer(y))
        return y

    def indexed_conv(self, x, idx, w, bias=None, residual=None, activation: str = "none", precision: str = "float32",
                     splits: int = 0):
        """IndexedConv: y [M, Cout]; `precision` "float16" or "bfloat16" multiplies X and W rounded to it on
        tensor cores, summing in float32; `splits` blocks share each output tile's taps (0: the library's
        choice for the GPU, 1: none)."""
        x, idx, w = self._array(x, np.float32), self._array(idx, np.int64), self._array(w, np.float32)
        bias, residual = self._array(bias, np.float32), self._array(residual, np.float32)
        rows, taps = idx.shape
        y = self.xp.empty((rows, w.shape[2]), np.float32)
        self._call("sl_indexed_conv", self._pointer(x), ctypes.c_int64(x.shape[0]), ctypes.c_int64(x.shape[1]),
                   self._pointer(idx), ctypes.c_int64(rows), ctypes.c_int64(taps), self._pointer(w),
                   ctypes.c_int64(w.shape[2]), self._pointer(bias), self._pointer(residual),
                   ctypes.c_int32(activation == "relu"), ctypes.c_int32(_PRODUCTS[precision]), ctypes.c_int32(splits),
                   self._pointer(y))
        return y

    def indexed_conv_int8(self, x, idx, w, x_scale, w_scale, bias=None, residual=None, activation: str = "none"):
        """IndexedConvInt8: y [M, Cout] from float rows x, int8 weights w and their scales; the CPU library's bits."""
        x, idx, w = self._array(x, np.float32), self._array(idx, np.int64), self._array(w, np.int8)
        x_scale, w_scale = self._array(x_scale, np.float32), self._array(w_scale, np.float32)
        bias, residual = self._array(bias, np.float32), self._array(residual, np.float32)
        rows, taps = idx.shape
        y = self.xp.empty((rows, w.shape[2]), np.float32)
        self._call("sl_indexed_conv_int8", self._pointer(x), ctypes.c_int64(x.shape[0]), ctypes.c_int64(x.shape[1]),
                   self._pointer(idx), ctypes.c_int64(rows), ctypes.c_int64(taps), self._pointer(w),
                   ctypes.c_int64(w.shape[2]), self._pointer(x_scale), self._pointer(w_scale), self._pointer(bias),
                   self._pointer(residual), ctypes.c_int32(activation == "relu"), self._pointer(y))
        return y
