"""The nna target's compute form: 1×1 Convs per kernel tap and a combine method, standard ops only."""

from .compute import COMBINES, NnaCompute

__all__ = ["COMBINES", "NnaCompute"]
