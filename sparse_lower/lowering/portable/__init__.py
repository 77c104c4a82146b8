"""The portable target: the whole lowered model in standard ONNX ops, for runtimes that cannot load the
library (docs/portable.md). The index tables are built inside the graph from site grids (grid.py,
sites.py, tables.py, boundary.py); the compute is the indexed unfold as Gather → MatMul (compute.py)."""

from .compute import PortableCompute
from .grid import MAX_GRID_BYTES
from .tables import StandardOpTables, grid_halos, index_memory, padding_reader

__all__ = ["MAX_GRID_BYTES", "PortableCompute", "StandardOpTables", "grid_halos", "index_memory", "padding_reader"]
