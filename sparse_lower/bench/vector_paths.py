"""`sparse-lower bench --suite vector-paths`: the CenterPoint backbone's float and int8 gpu forms on
each vector path of this CPU, side by side, and the int8 form's error on both real frames.

The library reads SPARSE_LOWER_NO_AMX, SPARSE_LOWER_NO_AVX512 and SPARSE_LOWER_PORTABLE_KERNELS once per
process, so each path runs in a process of its own: the widest units (runtime.vector_units()), VNNI
where the widest are AMX, AVX2 alone where they are AVX-512, and the portable loops. The processes take turns for `rounds` rounds, so that a
shared machine's drift falls on every path alike; each times `repeat` runs of both forms after a
warm-up on the real CenterPoint frame, and a path's figure is the median of all its runs. The int8
form is `sparse_lower.quantize` calibrated on both real frames; each path's outputs are compared bit
for bit with the widest path's.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

from ..api import lower
from ..frames.sample import real_feeds
from ..models import CanonicalEmitter, sp_middle_resnet_fhd
from ..quantization.gpu import quantize
from ..runtime import create_session, vector_units
from ..verify import relative_error, snr_db
from .cases import BEVFUSION_FILE, CENTERPOINT_FILE
from .systems import session_options
from ..measuring.timing import timed

FRAMES = {"centerpoint": CENTERPOINT_FILE, "bevfusion": BEVFUSION_FILE}  # timed on the first
PATHS = {"widest": {}, "vnni": {"SPARSE_LOWER_NO_AMX": "1"}, "avx2": {"SPARSE_LOWER_NO_AVX512": "1"},
         "portable": {"SPARSE_LOWER_PORTABLE_KERNELS": "1"}}
FORMS = ("float", "int8")


def paths(units: str | None = None) -> dict[str, dict]:
    """The paths this CPU has (name: the environment that forces it): VNNI only where the widest units
    are AMX, AVX2 alone only where they are AVX-512 (elsewhere each is the widest path)."""
    units = units or vector_units()
    has = {"vnni": units == "avx512-amx", "avx2": "avx512" in units}
    return {name: env for name, env in PATHS.items() if has.get(name, True)}


def child(folder: Path, threads: int, repeat: int) -> dict:
    """One path's runs: {"units", "float": [ms…], "int8": [ms…], "digests": {form: sha256 of the output}}."""
    feeds = real_feeds(FRAMES["centerpoint"])
    result = {"units": vector_units(), "digests": {}}
    for form in FORMS:
        session = create_session(str(folder / f"{form}.onnx"), sess_options=session_options(threads))
        (output,) = session.run(None, feeds)
        result["digests"][form] = hashlib.sha256(output.tobytes()).hexdigest()
        result[form] = [1e3 * timed(lambda: session.run(None, feeds)) for _ in range(repeat)]
    return result


def measure(repeat: int, rounds: int = 5, threads: int = 2, log=print) -> dict:
    """{"threads", "rounds", "repeat": the runs behind each median (rounds × repeat), "convs": [int8, all],
    "accuracy": {frame: {"max_error", "snr_db"}}, "paths": {name: {"units", "float_ms", "int8_ms",
    "same_bits": [forms]}}}."""
    frames = [real_feeds(file) for file in FRAMES.values()]
    lowered = lower(sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0)), target="gpu")
    quantized, found = quantize(lowered, frames)
    result = {"threads": threads, "rounds": rounds, "repeat": rounds * repeat, "convs": [len(found.tops), len(found.tops) + len(found.float_convs)],
              "accuracy": {}, "paths": {}}
    sessions = [create_session(model, sess_options=session_options(threads)) for model in (lowered, quantized)]
    for name, feeds in zip(FRAMES, frames):
        want, got = (session.run(None, feeds)[0] for session in sessions)
        result["accuracy"][name] = {"max_error": relative_error(got, want), "snr_db": snr_db(got, want)}
    del sessions
    chosen = paths()
    runs = {name: {form: [] for form in FORMS} for name in chosen}
    with tempfile.TemporaryDirectory() as folder:
        onnx.save(lowered, Path(folder) / "float.onnx")
        onnx.save(quantized, Path(folder) / "int8.onnx")
        for round_ in range(rounds):
            for name, env in chosen.items():
                done = subprocess.run([sys.executable, "-m", __name__, folder, str(threads), str(repeat)],
                                      env={**os.environ, **env}, check=True, capture_output=True, text=True)
                one = json.loads(done.stdout.splitlines()[-1])
                for form in FORMS:
                    runs[name][form] += one[form]
                runs[name]["units"], runs[name]["digests"] = one["units"], one["digests"]
            log(f"round {round_ + 1} of {rounds}")
    widest = runs["widest"]["digests"]
    for name, r in runs.items():
        result["paths"][name] = {"units": r["units"], "same_bits": [f for f in FORMS if r["digests"][f] == widest[f]],
                                 **{f"{form}_ms": float(np.median(r[form])) for form in FORMS}}
    return result


if __name__ == "__main__":  # one path's process (see `measure`)
    folder, threads, repeat = sys.argv[1:]
    print(json.dumps(child(Path(folder), int(threads), int(repeat))))
