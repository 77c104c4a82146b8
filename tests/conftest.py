"""Shared fixtures."""

import os
from pathlib import Path

import numpy as np
import pytest

from oracle import random_sparse

# The real frames: $SPARSE_LOWER_DATA (tools/gpu_check.py sets it on a GPU machine), else ../shared/data.
DATA = Path(os.environ.get("SPARSE_LOWER_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def sparse_input(rng):
    """10 unique active sites of one batch on the 8×8 grid, with 3 channels (the features and coords of
    helpers.model_with's model)."""
    return random_sparse(rng, 1, 3, (8, 8), count=10)
