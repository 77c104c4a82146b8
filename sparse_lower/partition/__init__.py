"""The partitioner: assign the nodes of a lowered graph to devices (nna, gpu, cpu) from capability
tables, cut it into acyclic segments, export each segment as its own ONNX model and run them in order.

    from sparse_lower.partition import partition
    parts = partition(lowered, devices=("nna", "gpu", "cpu"))
    print(parts.summary())
    parts.to_onnx("segments/")          # 00_gpu.onnx, 01_nna.onnx, ..., manifest.json
    outputs = parts.run({"features": f, "coords": c})

It works on any ONNX graph and knows no lowering rule (README: Layout): devices.py holds what each
device runs, segments.py the algorithm.
"""

from .devices import NNA_OPS, Predicate, cpu_support, device_table, gpu_support, nna_support
from .partitioner import DEFAULT_DEVICES, Partition, partition
from .segments import Segment
from .value_types import ValueTypes

__all__ = ["DEFAULT_DEVICES", "NNA_OPS", "Partition", "Predicate", "Segment", "ValueTypes", "cpu_support",
           "device_table", "gpu_support", "nna_support", "partition"]
