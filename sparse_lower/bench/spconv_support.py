"""Where spconv's `SpconvEmitter` comes from; the lookup raises ImportError with the reason."""

from __future__ import annotations


def spconv_emitter():
    """The `SpconvEmitter` class (importing torch and spconv: ImportError names what is missing)."""
    from ..models.spconv_emitter import SpconvEmitter

    return SpconvEmitter
