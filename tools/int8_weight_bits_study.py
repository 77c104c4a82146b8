"""7- against 8-bit weights in the gpu form's int8 convs (sparse_lower.quantize(weight_bits=)): the
CenterPoint backbone calibrated on one or both real frames, with no limit and with a 1 % limit, its BEV
output's largest relative error and SNR against float on each frame, the convs at 8 bits and their share
of the useful multiply-adds on the CenterPoint frame. The table of docs/performance.md "int8 on the gpu
target".

usage (from the checkout root, ../shared/data beside it): python tools/int8_weight_bits_study.py
"""

from __future__ import annotations

import numpy as np

import sparse_lower
from sparse_lower.bench.cases import BEVFUSION_FILE, CENTERPOINT_FILE
from sparse_lower.bench.layers import conv_work
from sparse_lower.frames.sample import real_feeds
from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd
from sparse_lower.verify import relative_error, snr_db


def main() -> None:
    frames = {"CenterPoint": real_feeds(CENTERPOINT_FILE), "BEVFusion": real_feeds(BEVFUSION_FILE)}
    source = sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0))
    lowered = sparse_lower.lower(source)
    work = {layer: values["flops"] for layer, values in conv_work(source, frames["CenterPoint"]).items()}
    reference = sparse_lower.create_session(lowered)
    want = {name: reference.run(None, feeds)[0] for name, feeds in frames.items()}
    print("| calibrated on | limit | weights | convs at 8 bits | work at 8 bits | CenterPoint | BEVFusion |")
    print("|---|---|---|---|---|---|---|")
    for calibrated_on in ("CenterPoint", "BEVFusion", "both"):
        calibration = list(frames.values()) if calibrated_on == "both" else [frames[calibrated_on]]
        for limit in (None, 0.01):
            for bits in (7, 8):
                quantized, found = sparse_lower.quantize(lowered, calibration, limit=limit, weight_bits=bits)
                session = sparse_lower.create_session(quantized)
                errors = []
                for name, feeds in frames.items():
                    got = session.run(None, feeds)[0]
                    errors.append(f"{relative_error(got, want[name]):.2%} / {snr_db(got, want[name]):.1f} dB")
                share = sum(work[name.split("/")[0]] for name in found.tops) / sum(work.values())
                print(f"| {calibrated_on} | {'none' if limit is None else f'{limit:.0%}'} | {bits} bits | "
                      f"{len(found.tops)} of {len(work)} | {share:.0%} | {' | '.join(errors)} |", flush=True)


if __name__ == "__main__":
    main()
