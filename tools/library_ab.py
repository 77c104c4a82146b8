"""Two builds of the custom-op library taking turns on a network's gpu form on a real frame: each index
table's kernel time (onnxruntime's profile of the index-only model, bench.systems.index_only), their
total, and with --whole the whole run, medians over rounds in which A and B alternate, so that a loaded
machine's drift falls on both. It also checks that both give the same tables and outputs, bit for bit.
This is the A/B of a kernel change: keep a copy of the installed library before rebuilding.
With --a-unsorted, A runs the model lowered without SortFirstSites (its first level in the frame's
order), which is the A/B of that pass when A and B are the same library.

    cp "$(python -c 'import sparse_lower.runtime as r; print(r.get_library_path())')" /tmp/before.so
    # … rebuild and install …
    python tools/library_ab.py /tmp/before.so "$(python -c 'import sparse_lower.runtime as r; print(r.get_library_path())')"
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import numpy as np

NETWORKS = ("centerpoint", "unet", "voxelnext")
FRAMES = ("centerpoint", "bevfusion")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("a", type=Path, help="library A (e.g. the build before a change)")
    parser.add_argument("b", type=Path, help="library B")
    parser.add_argument("--network", choices=NETWORKS, default="centerpoint",
                        help="the CenterPoint backbone (default), the sparse UNet or VoxelNeXt")
    parser.add_argument("--frame", choices=FRAMES, default="centerpoint", help="the real frame (default centerpoint)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of A then B (default 7)")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--whole", action="store_true", help="also time the whole run (the best of 3 per round)")
    parser.add_argument("--a-unsorted", action="store_true",
                        help="A's model lowered without SortFirstSites (the first level in the frame's order)")
    args = parser.parse_args()
    for library in (args.a, args.b):
        if not library.is_file():
            parser.error(f"{library} is not a file")

    from unittest import mock

    from sparse_lower.api import lower
    from sparse_lower.bench.cases import BEVFUSION_FILE, CENTERPOINT_FILE
    from sparse_lower.measuring.profile import profile
    from sparse_lower.bench.systems import index_only, session_options
    from sparse_lower.frames.sample import real_feeds
    from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd, sparse_unet, voxelnext
    from sparse_lower.passes.site_order import SortFirstSites
    from sparse_lower.runtime import LIBRARY_ENV, create_session

    feeds = real_feeds(CENTERPOINT_FILE if args.frame == "centerpoint" else BEVFUSION_FILE)
    network = {"centerpoint": sp_middle_resnet_fhd, "unet": sparse_unet, "voxelnext": voxelnext}[args.network]
    lowered = {"B": lower(network(CanonicalEmitter(), np.random.default_rng(0)), target="gpu")}
    with mock.patch.object(SortFirstSites, "call", lambda self, model: model) if args.a_unsorted else \
            contextlib.nullcontext():
        lowered["A"] = lower(network(CanonicalEmitter(), np.random.default_rng(0)), target="gpu")
    tables = {name: index_only(model) for name, model in lowered.items()}
    table_feeds = {name: {k: v for k, v in feeds.items() if k in {i.name for i in model.graph.input}}
                   for name, model in tables.items()}

    def session(library: Path, model):
        os.environ[LIBRARY_ENV] = str(library)
        return create_session(model, sess_options=session_options(args.threads))

    times: dict[str, dict[str, list[float]]] = {"A": {}, "B": {}}
    outputs = {}
    for _ in range(args.rounds):
        for name, library in (("A", args.a), ("B", args.b)):
            os.environ[LIBRARY_ENV] = str(library)
            found = profile(tables[name], table_feeds[name], session_options(args.threads), runs=3)
            for node, ms in found["by_node"].items():
                times[name].setdefault(node, []).append(ms)
            times[name].setdefault("index tables in all", []).append(found["total_ms"])
            if args.whole:
                whole = session(library, lowered[name])
                outputs[name] = whole.run(None, feeds)
                runs = []
                for _ in range(3):
                    start = time.perf_counter()
                    whole.run(None, feeds)
                    runs.append((time.perf_counter() - start) * 1e3)
                times[name].setdefault("whole run", []).append(min(runs))
    tables_equal = all(np.array_equal(x, y) for x, y in zip(session(args.a, tables["B"]).run(None, table_feeds["B"]),
                                                             session(args.b, tables["B"]).run(None, table_feeds["B"])))
    print(f"{args.network} on the {args.frame} frame, {args.threads} threads, medians of {args.rounds} rounds (ms)")
    print(f"{'node':44s} {'A':>9s} {'B':>9s} {'B / A':>7s}")
    for node in dict.fromkeys([*times["A"], *times["B"]]):
        a, b = (np.median(times[name].get(node, [0.0])) for name in ("A", "B"))
        if max(a, b) >= 0.1:
            ratio = f"{b / a:7.2f}" if a else f"{'new':>7s}"
            print(f"{node:44s} {a:9.2f} {b:9.2f} {ratio}")
    print("B's tables bitwise equal in both libraries:", tables_equal)
    if args.whole:
        print("outputs bitwise equal:", all(np.array_equal(x, y) for x, y in zip(outputs["A"], outputs["B"])))


if __name__ == "__main__":
    main()
