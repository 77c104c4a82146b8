"""rknn's int8 on the CenterPoint backbone outside calibration, a stage at a time (docs/toolchains.md, int8
on rknn outside calibration): calibrated on one real frame alone, measured on the other, with every layer
in float16 (hybrid quantization, the tensors between layers included) but those of one stage (conv1.x,
conv2.x, conv3.x, conv4.x), which rknn quantizes to int8; or every layer float16 (`all`), or only the
first and last (`none`).

    RKNN_VENV/bin/python tools/int8_rknn_stages.py CALIBRATED_ON(0: BEVFusion, 1: CenterPoint) STAGE|all|none

Run in an environment with rknn-toolkit2 2.5.0 (docs/toolchains.md), this checkout on PYTHONPATH and
SPARSE_LOWER_LIBRARY naming the built library; 2-6 min and up to 14 GB a build. Prints one JSON line.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time

import sparse_lower
from sparse_lower.quantization.products import layer_products, weight_products
from sparse_lower.toolchains import compile_partition
from sparse_lower.verify import relative_error
from toolchain_table import FRAMES, capacities_for, frame, real_models


def main() -> None:
    calibrated_on, which = int(sys.argv[1]), sys.argv[2]
    model = dict(real_models())["CenterPoint backbone"]
    frames = {name: frame(name) for name in FRAMES}
    lowered = sparse_lower.lower(model, target="nna", combine="gather", layout="rows",
                                 max_active=capacities_for(model, list(frames.values())))
    layers = list(layer_products(weight_products(lowered)))
    wide = {"all": layers, "none": []}.get(which) or [layer for layer in layers if not layer.startswith(which + ".")]
    calibrated, measured = FRAMES[calibrated_on], FRAMES[1 - calibrated_on]
    session = sparse_lower.create_session(lowered)
    want = dict(zip([o.name for o in session.get_outputs()], session.run(None, frames[measured])))
    folder = tempfile.mkdtemp(prefix="rknn-stage-")
    started = time.perf_counter()
    compiled = compile_partition(sparse_lower.partition(lowered), "rknn", folder, calibration=[frames[calibrated]],
                                 wide_layers=wide)
    built = time.perf_counter() - started
    got = compiled.run(frames[measured])
    error = max(relative_error(got[n], want[n]) for n in want if want[n].dtype.kind == "f")
    print(json.dumps({"calibrated": calibrated, "measured": measured, "int8": which,
                      "int8_layers": [layer for layer in layers if layer not in wide], "error": error,
                      "built_s": round(built), "run_s": round(time.perf_counter() - started - built)}))
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
