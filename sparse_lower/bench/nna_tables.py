"""`sparse-lower bench --suite nna-tables`: the nna target's tables from the library against in standard ops
(`tables="standard"`), on CenterPoint's backbone.

SpMiddleResNetFHD (5 voxel features, deterministic weights) lowered for the nna target with a capacity per
level (the portable suite's LEVELS: both real frames' sites with a margin; the gather combine, rows layout),
once with the library's tables, run in a session with the library, and once with standard tables, run in
a plain onnxruntime session with no library registered. On each real frame the two take turns; each gets
the median of a whole run and of its index part alone (bench.systems.index_only: every node that does not
read the features, the host's share of the work), and the largest difference between their outputs.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort

from ..api import lower
from ..frames.sample import real_feeds
from ..models import CanonicalEmitter, sp_middle_resnet_fhd
from ..runtime import create_session
from .portable import FRAMES, LEVELS, THREADS
from .systems import index_only, session_options
from ..measuring.timing import alternating_medians

SYSTEMS = {"library": "library tables", "standard": "standard tables, plain onnxruntime"}


def sessions(tables: str, threads: int = THREADS) -> tuple:
    """(the whole model, its index part) lowered with `tables`, each in its session."""
    model = sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0))
    lowered = lower(model, target="nna", max_active=LEVELS, layout="rows", tables=tables)
    if tables == "library":
        return tuple(create_session(m, sess_options=session_options(threads)) for m in (lowered, index_only(lowered)))
    return tuple(ort.InferenceSession(m.SerializeToString(), session_options(threads), providers=["CPUExecutionProvider"])
                 for m in (lowered, index_only(lowered)))


def measure(repeat: int, threads: int = THREADS, log=print) -> dict:
    """{"threads", "levels", "frames": {frame: {"voxels", "difference", "systems": {system: {"median_ms",
    "tables_ms"}}}}}; `difference`: the standard form's outputs' largest distance from the library form's,
    relative to their largest magnitude."""
    built = {title: sessions(tables, threads) for tables, title in SYSTEMS.items()}
    result = {"threads": threads, "levels": list(LEVELS), "frames": {}}
    for frame, file in FRAMES.items():
        feeds = real_feeds(file)
        index_inputs = {i.name for _, index in built.values() for i in index.get_inputs()}  # the coords
        table_feeds = {name: value for name, value in feeds.items() if name in index_inputs}
        library, standard = (whole.run(None, feeds)[0] for whole, _ in built.values())
        whole = alternating_medians({title: pair[0] for title, pair in built.items()}, feeds, repeat)
        tables = alternating_medians({title: pair[1] for title, pair in built.items()}, table_feeds, repeat)
        result["frames"][frame] = {
            "voxels": len(feeds["coords"]),
            "difference": float(np.abs(standard - library).max() / np.abs(library).max()),
            "systems": {title: {"median_ms": whole[title], "tables_ms": tables[title]} for title in built}}
        log(f"{frame} frame: " + ", ".join(f"{title} {whole[title]:,.0f} ms (index part {tables[title]:,.0f} ms)"
                                          for title in built))
    return result
