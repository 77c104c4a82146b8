"""The gpu target's int8 on a frame outside calibration (docs/performance.md, int8): the CenterPoint
backbone calibrated on one real frame alone and measured on the other, both ways, for each accuracy
limit of `sparse_lower.quantize` (none: every conv whose input stays >= 0 at 8 bits) and each headroom.
Prints a markdown table: max relative error and SNR of the BEV output against float on the frame not
calibrated on (and on the calibration frame), the convs at 8 bits and their share of the useful work.

    python tools/int8_cross_calibration_gpu.py [--limits none,0.02,0.01] [--headrooms 1,2]
"""

from __future__ import annotations

import argparse

import numpy as np

from sparse_lower.api import lower
from sparse_lower.bench.cases import BEVFUSION_FILE, CENTERPOINT_FILE
from sparse_lower.bench.layers import conv_work
from sparse_lower.frames.sample import real_feeds
from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd
from sparse_lower.quantization.gpu import quantize
from sparse_lower.report import markdown_table
from sparse_lower.runtime import create_session
from sparse_lower.verify import relative_error, snr_db

FRAMES = {"CenterPoint": CENTERPOINT_FILE, "BEVFusion": BEVFUSION_FILE}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limits", default="none,0.02,0.01")
    parser.add_argument("--headrooms", default="1,2")
    args = parser.parse_args()
    frames = {name: real_feeds(file) for name, file in FRAMES.items()}
    source = sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0))
    lowered = lower(source, target="gpu")
    work = conv_work(source, frames["CenterPoint"])
    total = sum(layer["flops"] for layer in work.values())
    reference = create_session(lowered)
    expected = {name: reference.run(None, feeds)[0] for name, feeds in frames.items()}
    rows = []
    for headroom in map(float, args.headrooms.split(",")):
        for limit in (None if value == "none" else float(value) for value in args.limits.split(",")):
            for calibrated, measured in (("CenterPoint", "BEVFusion"), ("BEVFusion", "CenterPoint")):
                quantized, found = quantize(lowered, [frames[calibrated]], limit=limit, headroom=headroom)
                session = create_session(quantized)
                got = {name: session.run(None, frames[name])[0] for name in (measured, calibrated)}
                share = sum(work[name.split("/")[0]]["flops"] for name in found.tops) / total
                rows.append([f"{headroom:g}", "none" if limit is None else f"{100 * limit:g} %",
                             f"{calibrated} → {measured}",
                             f"{100 * relative_error(got[measured], expected[measured]):.2f} %",
                             f"{snr_db(got[measured], expected[measured]):.1f} dB",
                             f"{100 * relative_error(got[calibrated], expected[calibrated]):.2f} %",
                             f"{len(found.tops)} of {len(found.tops) + len(found.float_convs)}", f"{100 * share:.0f} %"])
                print(" | ".join(rows[-1]), flush=True)
    print(markdown_table(["headroom", "limit", "calibrated → measured", "max error", "SNR",
                          "on the calibration frame", "convs at 8 bits", "work at 8 bits"], rows))


if __name__ == "__main__":
    main()
