"""Run under emulation by tests/test_aarch64.py (tools/aarch64.sh python): every case_*.onnx of a folder
in onnxruntime, with the aarch64 custom-op library but for the cases plain.txt names (run as on a board
with no library), on its case_*.in.npz, written to case_*.out.npz; then the vector
units the library's kernels used (its last line). The x86 side compares; this side only runs (the arm64
Python here has onnxruntime and numpy only)."""

import ctypes
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

folder, library = Path(sys.argv[1]), sys.argv[2]


def options(with_library: bool) -> ort.SessionOptions:
    chosen = ort.SessionOptions()
    if with_library:
        chosen.register_custom_ops_library(library)
    chosen.intra_op_num_threads = 2
    chosen.log_severity_level = 3
    return chosen


plain = set((folder / "plain.txt").read_text().split()) if (folder / "plain.txt").is_file() else set()
for model in sorted(folder.glob("case_*.onnx")):
    session = ort.InferenceSession(str(model), options(model.stem not in plain), providers=["CPUExecutionProvider"])
    with np.load(model.with_suffix(".in.npz")) as inputs:
        feeds = {name: inputs[name] for name in inputs.files}
    names = [output.name for output in session.get_outputs()]
    np.savez(model.with_suffix(".out.npz"), **dict(zip(names, session.run(names, feeds))))
units = ctypes.CDLL(library).SparseLowerVectorUnits
units.restype = ctypes.c_char_p
print("ran", len(list(folder.glob("case_*.onnx"))), "cases")
print(units().decode())
