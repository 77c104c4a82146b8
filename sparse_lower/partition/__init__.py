"""The partitioner: assign the nodes of a lowered graph to devices (nna, gpu, cpu) from capability
tables, cut it into acyclic segments, export each segment as its own ONNX model and run them in order.

    from sparse_lower.partition import partition
    parts = partition(lowered, devices=("nna", "gpu", "cpu"))
    print(parts.summary())
    parts.to_onnx("segments/")          # 00_gpu.onnx, 01_nna.onnx, ..., manifest.json
    outputs = parts.run({"features": f, "coords": c})

It works on any ONNX graph and knows no lowering rule (docs/layout.md): devices.py holds what each
device runs, segments.py the algorithm, partitioner.py puts them together, result.py holds the
`Partition` (segment_files.py writes its segments, reports.py and picture.py describe it, node_costs.py
prices any ONNX node). `sparse_lower.partition` is this `partition` with the lowering's per-layer
cost table handed in (`layer_table`), so that its summary also prices each sparse layer per method.
"""

from .devices import NNA_OPS, Predicate, cpu_support, device_table, gpu_support, nna_support
from .partitioner import DEFAULT_DEVICES, partition
from .result import LayerTable, Partition
from .segments import Segment
from .value_types import ValueTypes

__all__ = ["DEFAULT_DEVICES", "NNA_OPS", "LayerTable", "Partition", "Predicate", "Segment", "ValueTypes",
           "cpu_support", "device_table", "gpu_support", "nna_support", "partition"]
