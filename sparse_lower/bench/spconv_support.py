"""Where the optional systems come from: spconv's `SpconvEmitter` and MinkowskiEngine. Each lookup
raises ImportError with the reason."""

from __future__ import annotations

import importlib


def spconv_emitter():
    """The `SpconvEmitter` class (importing torch and spconv: ImportError names what is missing)."""
    from ..models.spconv_emitter import SpconvEmitter

    return SpconvEmitter


def minkowski_reason() -> str | None:
    """None when MinkowskiEngine imports, else why it does not."""
    try:
        importlib.import_module("MinkowskiEngine")
    except Exception as error:  # ImportError, or a broken CUDA build raising something else
        return f"MinkowskiEngine not installed ({type(error).__name__}: {error})"
    return None
