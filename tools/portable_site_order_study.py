"""A one-off study: the portable model of CenterPoint's backbone on the real CenterPoint frame, fed its
rows in the frame's scan order and sorted by site, taking turns (medians of --rounds alternating runs),
with both outputs compared bit for bit. It measures what sorting the first level (as the gpu target's
SortFirstSites does) could gain in the portable form before the sort's own cost.

    python tools/portable_site_order_study.py --rounds 7
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--rounds", type=int, default=7, help="alternating runs of each order (default 7)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    args = parser.parse_args()

    import onnxruntime as ort

    from sparse_lower.bench.cases import CENTERPOINT_FILE
    from sparse_lower.bench.portable import SYSTEMS, backbone
    from sparse_lower.bench.systems import session_options
    from sparse_lower.frames.sample import real_feeds

    session = ort.InferenceSession(backbone(SYSTEMS[1]).SerializeToString(), session_options(args.threads),
                                   providers=["CPUExecutionProvider"])
    scan = real_feeds(CENTERPOINT_FILE)
    order = np.lexsort(scan["coords"].T[::-1])  # by batch, then z, y, x
    feeds = {"scan order": scan, "site order": {name: value[order] for name, value in scan.items()}}
    outputs = {name: session.run(None, feed) for name, feed in feeds.items()}
    times: dict[str, list[float]] = {name: [] for name in feeds}
    for _ in range(args.rounds):
        for name, feed in feeds.items():
            start = time.perf_counter()
            session.run(None, feed)
            times[name].append((time.perf_counter() - start) * 1e3)
    for name, runs in times.items():
        print(f"{name}: {np.median(runs):,.0f} ms")
    print("outputs bitwise equal:", all(np.array_equal(a, b) for a, b in zip(*outputs.values())))


if __name__ == "__main__":
    main()
