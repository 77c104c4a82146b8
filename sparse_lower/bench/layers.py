"""`sparse-lower bench --suite layers`: the CenterPoint backbone's gpu form on the real CenterPoint frame,
each sparse conv against the GEMM peak measured in the same run, in float32, bfloat16 and int8.

Per layer: its useful work (2 · pairs · Cin · Cout, the pairs of its neighbour table on the frame), its
conv's kernel time in onnxruntime's profile (`IndexedConv`, at precision "bfloat16" in the bf16 form,
and `IndexedConvInt8` in the int8 form, on the widest vector units: runtime.vector_units()), the float
rate as a share of the two-thread GEMM peak (onnxruntime's MatMul 2048³, the best of its runs before and
after the profiles, so that a machine's drift does not flatter the layers), and the speed-ups of bf16
and int8 over float; then the same for the narrow layers together (5 to 32 input channels), for every
conv, for the index tables (the nodes that do not read the features: bench.systems.index_only) and for the
whole run, whose rate is the convs' useful work over every kernel's time. That is the table the CPU
kernels' work is chosen from: which layers fall short of the peak, what the convs leave to the rest of the
run, and where the narrower precisions gain.
"""

from __future__ import annotations

import numpy as np

from ..api import lower
from ..frames.sample import real_feeds
from ..models import CanonicalEmitter, sp_middle_resnet_fhd
from ..quantization.gpu import quantize
from ..runtime import create_session, vector_units
from .cases import BEVFUSION_FILE, CENTERPOINT_FILE
from ..measuring.profile import profile
from .systems import gemm_peak_gflops, index_only, layer_flops, session_options

CONVS = ("IndexedConv", "IndexedConvInt8")
FORMS = ("float", "bf16", "int8")


def conv_ms(found: dict) -> dict[str, float]:
    """{layer: ms} of the convs in a profile (measuring.profile's by_node): the node `LAYER/…` of a conv op."""
    return {node.split("/")[0]: ms for node, ms in found["by_node"].items() if node.split("/")[-1] in CONVS}


def tables_ms(model, found: dict) -> float:
    """The kernel ms of a profile (measuring.profile) spent on the index tables of `model`: its nodes that do
    not depend on the features (bench.systems.index_only)."""
    tables = {node.name for node in index_only(model).graph.node}
    return sum(ms for node, ms in found["by_node"].items() if node in tables)


def conv_work(source, feeds: dict) -> dict[str, dict]:
    """{layer: {"cin", "cout", "pairs", "flops"}} of the sparse convs of `source` (a model of source ops) on
    `feeds`, from the neighbour tables of its gpu-unfold form (systems.layer_flops)."""
    unfold = lower(source, target="gpu", strategy="unfold")
    tables_model = index_only(unfold)
    session = create_session(tables_model)
    names = [o.name for o in session.get_outputs()]
    inputs = {v.name for v in tables_model.graph.input}
    return layer_flops(unfold, dict(zip(names, session.run(None, {k: v for k, v in feeds.items() if k in inputs}))))


def measure(repeat: int, threads: int = 2, log=print) -> dict:
    """{"threads", "units", "peak_gflops", "layers": [{"layer", "cin", "cout", "pairs", "flops", "float_ms",
    "bf16_ms", "int8_ms"}], "float_ms", "bf16_ms", "int8_ms", "float_tables_ms", "bf16_tables_ms",
    "int8_tables_ms"}: kernel ms per run (the whole run's, then its index tables'), the mean of `repeat`
    profiled runs."""
    frames = [real_feeds(CENTERPOINT_FILE), real_feeds(BEVFUSION_FILE)]
    source = sp_middle_resnet_fhd(CanonicalEmitter(), np.random.default_rng(0))
    lowered = lower(source, target="gpu")
    quantized, _ = quantize(lowered, frames)
    work = conv_work(source, frames[0])
    log("measuring the two-thread GEMM peak…")
    peaks = [gemm_peak_gflops(2048, 9, threads=threads)]
    profiles = {}
    models = {"float": lowered, "bf16": lower(source, target="gpu", precision="bf16"), "int8": quantized}
    for form, model in models.items():
        log(f"profiling the {form} form…")
        profiles[form] = profile(model, frames[0], session_options(threads), runs=repeat)
    peaks.append(gemm_peak_gflops(2048, 9, threads=threads))
    times = {form: conv_ms(found) for form, found in profiles.items()}
    layers = [{"layer": layer, **values, **{f"{form}_ms": times[form][layer] for form in FORMS}}
              for layer, values in work.items()]
    return {"threads": threads, "units": vector_units(), "peak_gflops": max(peaks), "peaks": peaks, "layers": layers,
            **{f"{form}_ms": found["total_ms"] for form, found in profiles.items()},
            **{f"{form}_tables_ms": tables_ms(models[form], found) for form, found in profiles.items()}}
