"""`--active`, added alike to convert, inspect and partition: one meaning, the active sites assumed
per sparse input (for random inputs and cost tables), and one default, the input model's
`assumed_active` (sparse_lower/assumed_active.py)."""

from __future__ import annotations

import argparse

from ..assumed_active import DEFAULT_ACTIVE
from .counts import count


def add_active_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--active", type=count(1),
                        help="active sites assumed per sparse input, for random inputs and cost tables (default: "
                             f"the input model's max_active for its first level where it was lowered with one, "
                             f"else {DEFAULT_ACTIVE})")
