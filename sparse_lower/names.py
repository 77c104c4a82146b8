"""Names: fresh ones for graph builders (the lowering, the importers, the export and the model writers
all add tensors and nodes to graphs whose names must stay unique), and the label a message gives a
node that may have none."""

from __future__ import annotations

from collections.abc import Iterable

import onnx


def node_label(node: onnx.NodeProto, index: int) -> str:
    """The name errors use for a node: its own, or its op and position where the model left it empty."""
    return node.name or f"{node.op_type}#{index}"


class UniqueNames:
    """A set of taken names that hands out new ones: `base`, else `base_1`, `base_2`, …"""

    def __init__(self, taken: Iterable[str] = ()):
        self._taken = set(taken)

    def __contains__(self, name: str) -> bool:
        return name in self._taken

    def add(self, name: str) -> None:
        self._taken.add(name)

    def fresh(self, base: str) -> str:
        name, index = base, 1
        while name in self._taken:
            name, index = f"{base}_{index}", index + 1
        self._taken.add(name)
        return name
