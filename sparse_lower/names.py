"""Fresh names for graph builders: the lowering, the importers, the exporter and the model writers
all add tensors and nodes to graphs whose names must stay unique."""

from __future__ import annotations

from collections.abc import Iterable


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
