"""Shared fixtures."""

from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture
def rng():
    return np.random.default_rng(0)
