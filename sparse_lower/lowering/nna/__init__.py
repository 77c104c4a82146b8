"""The nna target's compute form: 1×1 Convs (or MatMuls on rows) per kernel tap and a combine method,
standard ops only."""

from .compute import COMBINES, NnaCompute
from .layout import LAYOUTS

__all__ = ["COMBINES", "LAYOUTS", "NnaCompute"]
