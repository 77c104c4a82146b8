"""The CenterPoint backbone tuned with 8 bits as a form (sparse_lower.tune with calibration frames) on the
real CenterPoint frame, 2 threads: per calibration frame and limit, the convs put at 8 bits, the whole
model's median ms without and with them (tune's own alternating timing), and the tuned model's largest
relative error against float on both real frames. The table of docs/performance.md "Per conv by
measurement".

usage (from the checkout root, ../shared/data beside it): python tools/tune_int8_study.py
"""

from __future__ import annotations

import time

import numpy as np

import sparse_lower
from sparse_lower.bench.cases import BEVFUSION_FILE, CENTERPOINT_FILE
from sparse_lower.frames.sample import real_feeds
from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd
from sparse_lower.tuning import INT8
from sparse_lower.verify import relative_error

RUNS = (("CenterPoint", 0.01), ("CenterPoint", 0.02), ("BEVFusion", 0.02))  # calibration frame, limit


def main() -> None:
    frames = {"CenterPoint": real_feeds(CENTERPOINT_FILE), "BEVFusion": real_feeds(BEVFUSION_FILE)}
    source = sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0))
    reference = sparse_lower.create_session(sparse_lower.lower(source))
    print("| calibrated on | limit | convs at 8 bits | whole model ms, float → tuned | error on CenterPoint "
          "| error on BEVFusion | tune s |")
    print("|---|---|---|---|---|---|---|")
    for calibrated_on, limit in RUNS:
        start = time.perf_counter()
        tuned, found = sparse_lower.tune(source, [frames["CenterPoint"]], calibration_frames=[frames[calibrated_on]],
                                         int8_limit=limit)
        seconds = time.perf_counter() - start
        session = sparse_lower.create_session(tuned)
        errors = [max(relative_error(got, want) for got, want in zip(session.run(None, feeds), reference.run(None, feeds))
                      if want.dtype.kind == "f") for feeds in frames.values()]
        timed = [ms for what, ms in found.tried.items() if what.endswith(INT8)]
        without, with_it = timed[0] if timed else (float("nan"), float("nan"))
        print(f"| {calibrated_on} | {limit:.0%} | {len(found.int8_convs)} | {without:.1f} → {with_it:.1f} "
              f"({without / with_it:.2f}×) | {errors[0]:.2%} | {errors[1]:.2%} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
