"""Run under emulation by tests/test_aarch64.py (tools/aarch64.sh board): the package as pip installs its
aarch64 wheel on a board, used as a user there would: `sparse-lower run MODEL FRAME -o OUT` (the model
lowered there, then run through the library of the wheel), then the library's path and vector units
(the last two lines)."""

import sys

from sparse_lower.cli.main import main
from sparse_lower.runtime import get_library_path, vector_units

model, frame, out = sys.argv[1:4]
status = main(["run", model, frame, "-o", out, "--threads", "2", "-q"])
print(get_library_path())
print(vector_units())
sys.exit(status)
