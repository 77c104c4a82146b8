"""Tables of the documentation written from a benchmark's results file, never typed: each table says
the machine, its CPU units, the date and the commit it was measured on, and a test (tests/test_tables.py)
fails when a table and its results file disagree. `python tools/render_tables.py` writes them.

A table lives in its document between two markers, `<!-- table NAME: FILE -->` and `<!-- end of table
NAME -->`; FILE is the results file (relative to the repository root) that it is written from.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..report import markdown_table
from .provenance import captioned
from .toolchain_table import toolchains_table

# the README's speed table: CenterPoint's backbone on both real frames, a row per system
SPEED_SYSTEMS = {"ours-gpu-auto": "sparse_lower, gpu target, 1 thread",
                 "ours-gpu-auto-2threads": "sparse_lower, gpu target, 2 threads",
                 "spconv-2.3.8": "spconv 2.3.8, 1 thread (its CPU kernels give wrong sums on more)",
                 "minkowski-0.5.4": "MinkowskiEngine 0.5.4, 2 threads"}
SPEED_FRAMES = {"centerpoint/centerpoint-frame": "CenterPoint frame", "centerpoint/bevfusion-frame": "BEVFusion frame"}


def speed_table(result: dict) -> str:
    """CenterPoint's backbone on the real frames, ms per frame (medians), a row per system measured."""
    cases = {record["case"]: record for record in result["cases"] if record["case"] in SPEED_FRAMES}
    header = ["system", *(f"{SPEED_FRAMES[name]} ({cases[name]['rows_in']:,} voxels)" for name in SPEED_FRAMES)]
    rows = []
    for system, title in SPEED_SYSTEMS.items():
        times = [cases[name]["systems"].get(system, {}).get("median_ms") for name in SPEED_FRAMES]
        if any(ms is not None for ms in times):
            rows.append([title, *("–" if ms is None else f"{ms:,.1f}" for ms in times)])
    return captioned(result, markdown_table(header, rows))


def results_table(result: dict) -> str:
    """Every case and system of a benchmark run, as its results.md holds them (bench.run.markdown), the
    provenance in the caption."""
    from .run import markdown  # the bench's own rendering: one table, written once

    table = [line for line in markdown(result).splitlines() if line.startswith("|")]
    return captioned(result, "\n".join(table))


# the scaling table: the voxels of each case, and its systems' medians and peak memory
SCALING_SYSTEMS = {"ours-gpu-auto": "gpu, 1 thread", "ours-gpu-auto-2threads": "gpu, 2 threads",
                   "ours-nna-levels-2threads": "nna per level, 2 threads", "ours-nna-pairs-2threads": "nna pairs, 2 threads",
                   "spconv-2.3.8": "spconv"}
SCALING_MEMORY = ["ours-gpu-auto", "ours-nna-levels-2threads", "ours-nna-pairs-2threads", "spconv-2.3.8"]


def scaling_table(result: dict) -> str:
    """`sparse-lower bench --scaling`: ms per frame by voxel count, and peak memory (GiB) of the gpu target,
    the nna forms and spconv."""
    header = ["voxels", *(f"{title} ms" for title in SCALING_SYSTEMS.values()),
              "peak GiB: gpu / nna per level / nna pairs / spconv"]
    rows = []
    for record in result["cases"]:
        systems = record["systems"]
        times = [systems.get(name, {}).get("median_ms") for name in SCALING_SYSTEMS]
        memory = [systems.get(name, {}).get("peak_rss_mb") for name in SCALING_MEMORY]
        voxels = record["case"].split("/")[-1].replace("1000k", "1M")
        rows.append([voxels, *("–" if ms is None else f"{ms:,.1f}" for ms in times),
                     " / ".join("–" if mb is None else f"{mb / 1024:.2f}" for mb in memory)])
    return captioned(result, markdown_table(header, rows))


# the VoxelNeXt table: a row per system, a column per frame
VOXELNEXT_SYSTEMS = {"ours-gpu-auto": "sparse_lower, gpu target, 1 thread",
                     "ours-gpu-auto-2threads": "sparse_lower, gpu target, 2 threads",
                     "ours-nna-levels-2threads": "sparse_lower, nna, a capacity per level (rows layout, 2 threads)",
                     "ours-nna-pairs-2threads": "sparse_lower, nna pairs combine (2 threads)",
                     "spconv-2.3.8": "spconv 2.3.8, 1 thread"}


def voxelnext_table(result: dict) -> str:
    """`sparse-lower bench --cases 'voxelnext/*'`: ms per frame of each system on each real frame (rows in
    → the sparse BEV sites out), a skipped one with its reason."""
    cases = result["cases"]
    header = ["system", *(f"{c['case'].split('/')[-1]} ({c['rows_in']:,} voxels → {c['rows_out']:,} BEV sites)"
                          for c in cases)]
    rows = []
    for system, title in VOXELNEXT_SYSTEMS.items():
        cells = [case["systems"].get(system, {}) for case in cases]
        rows.append([title, *(f"{cell['median_ms']:,.1f} ms" if "median_ms" in cell else
                              f"({cell.get('skipped', 'not run')})" for cell in cells)])
    return captioned(result, markdown_table(header, rows))


FRAME_TITLES = {"centerpoint": "CenterPoint", "bevfusion": "BEVFusion"}


def threads_table(result: dict) -> str:
    """`sparse-lower bench --suite threads`: a table per real frame, a row per thread count: ours and
    spconv (ms, speed-up over one thread), how far spconv's output is from ours, the GEMM peak."""
    tables = []
    header = ["threads", "ours ms", "ours speed-up", "spconv ms", "spconv speed-up", "spconv vs ours",
              "GEMM peak GFLOP/s"]
    for frame, record in result["frames"].items():
        one = record["threads"][str(result["threads"][0])]
        rows = [[n, f"{r['ours_ms']:,.0f}", f"{one['ours_ms'] / r['ours_ms']:.2f}",
                 *([f"{r['spconv_ms']:,.0f}", f"{one['spconv_ms'] / r['spconv_ms']:.2f}", f"{r['spconv_distance']:.1e}"]
                   if "spconv_ms" in r else ["–", "–", "–"]),
                 f"{result['gemm_peak_gflops'][n]:,.0f}"] for n, r in record["threads"].items()]
        tables.append(f"{FRAME_TITLES[frame]} frame, {record['voxels']:,} voxels:\n\n{markdown_table(header, rows)}")
    skipped = f"\n\n{result['spconv_skipped']}" if "spconv_skipped" in result else ""
    return captioned(result, "\n\n".join(tables) + skipped)


def vector_paths_table(result: dict) -> str:
    """`sparse-lower bench --suite vector-paths`: a row per vector path (float and int8 ms, their ratio,
    the same bits as the widest path's), and the int8 form's error on each real frame."""
    rows = [[f"{name} ({path['units']})", f"{path['float_ms']:,.1f}", f"{path['int8_ms']:,.1f}",
             f"{path['float_ms'] / path['int8_ms']:.2f}×", ", ".join(path["same_bits"]) or "none"]
            for name, path in result["paths"].items()]
    times = markdown_table(["path", "float ms", "int8 ms", "float / int8", "same bits as the widest path"], rows)
    errors = markdown_table(["frame", "int8 max error", "int8 SNR"],
                            [[FRAME_TITLES[frame], f"{100 * e['max_error']:.2f} %", f"{e['snr_db']:.1f} dB"]
                             for frame, e in result["accuracy"].items()])
    int8, convs = result["convs"]
    return captioned(result, f"CenterPoint frame, {result['threads']} threads, the paths' processes taking turns "
                             f"for {result['rounds']} rounds:\n\n{times}\n\nThe int8 form ({int8} of {convs} "
                             f"convs in 8 bits) against float:\n\n{errors}")


def _frames_by_system(result: dict, cells) -> list[list]:
    """A row per real frame and system: the frame, its voxels, the system, its median and the median's ratio
    to the first system's, then `cells(record, entry)`."""
    rows = []
    for frame, record in result["frames"].items():
        first = next(iter(record["systems"].values()))["median_ms"]
        rows += [[FRAME_TITLES[frame], f"{record['voxels']:,}", system, f"{entry['median_ms']:,.0f} ms",
                  f"{entry['median_ms'] / first:.2f}×", *cells(record, entry)]
                 for system, entry in record["systems"].items()]
    return rows


def portable_table(result: dict) -> str:
    """`sparse-lower bench --suite portable`: a row per real frame and system: median, ratio to the gpu
    target, peak memory, and the portable outputs' largest difference from the gpu target's."""
    rows = _frames_by_system(result, lambda record, entry: [f"{entry['peak_mb']:,.0f} MiB",
                                                            f"{record['difference']:.1e}"])
    table = markdown_table(["frame", "voxels", "system", "median", "/ gpu target", "peak memory",
                            "max relative difference from the gpu target"], rows)
    split = _portable_split(result) if "peak_gflops" in result else ""
    return captioned(result, f"{result['threads']} threads, the systems taking turns in one process:\n\n{table}{split}")


def _portable_split(result: dict) -> str:
    """The portable suite's time split (bench.portable.time_split), a row per frame, and the products' floor:
    every tap's work at the same run's GEMM peak, against the gpu target's median (which multiplies only
    the taps with a neighbour)."""
    peak, rows = result["peak_gflops"], []
    for frame, record in result["frames"].items():
        split, gpu = record["split"], next(iter(record["systems"].values()))["median_ms"]
        dense, pairs = split["dense_gflop"], split["pairs_gflop"]
        floor = dense / peak * 1e3
        rows.append([FRAME_TITLES[frame], *(f"{split[k]:,.0f} ms" for k in ("total_ms", "products_ms", "unfold_ms",
                                                                              "tables_ms", "rest_ms")),
                     f"{dense:.1f}", f"{pairs:.1f}", f"{dense / pairs:.2f}×",
                     f"{100 * dense / split['products_ms'] * 1e3 / peak:.0f} %", f"{floor:,.0f} ms",
                     f"{floor / gpu:.2f}×", f"{100 * pairs / gpu * 1e3 / peak:.0f} %"])
    table = markdown_table(["frame", "kernels", "products", "unfolds", "index tables", "rest", "GFLOP, every tap",
                            "GFLOP, taps with a neighbour", "ratio", "products' rate, of the peak",
                            "every tap at the peak", "/ gpu target", "gpu target's useful rate, of the peak"], rows)
    return (f"\n\nWhere the dynamic portable form's kernel time goes (onnxruntime's profile, the mean of 3 runs), "
            f"and its products' floor: every tap's work at the GEMM peak of the same run (onnxruntime's MatMul "
            f"2048³ on {result['threads']} threads, {peak:.1f} GFLOP/s, the best of its measures before the frames "
            f"and after each):\n\n{table}")


def kernel_instructions_table(result: dict) -> str:
    """tools/kernel_instructions.py: a row per aarch64 row-GEMM path, its inner loop's instructions against
    the multiply-adds they form."""
    rows = [[path, f"`{k['function'].split('::')[-1]}`", k["instructions"], k["multiply_add_instructions"],
             k["loads"], k["stores"], k["multiply_adds"], f"{k['instructions'] / k['multiply_adds']:.3f}",
             f"{k['multiply_add_instructions'] / k['multiply_adds']:.3f}"] for path, k in result["kernels"].items()]
    table = markdown_table(["path", "function", "loop instructions", "multiply-add instructions", "loads", "stores",
                            "multiply-adds", "instructions per multiply-add", "floor (multiply-add instructions alone)"],
                           rows)
    return (f"Counted from the disassembly of the aarch64 library ({result['compiler']}), {result['date']}, commit "
            f"{result['commit']}:\n\n{table}")


def nna_tables_table(result: dict) -> str:
    """`sparse-lower bench --suite nna-tables`: a row per real frame and system: the whole run's median, its
    ratio to the library tables', the index part's median, and the outputs' largest difference."""
    rows = _frames_by_system(result, lambda record, entry: [f"{entry['tables_ms']:,.0f} ms",
                                                            f"{record['difference']:.1e}"])
    levels = ", ".join(f"{n:,}" for n in result["levels"])
    return captioned(result, f"{result['threads']} threads, max_active {levels}, the systems taking turns in one "
                             f"process:\n\n" + markdown_table(["frame", "voxels", "tables", "median",
                                                               "/ library tables", "index part alone",
                                                               "max relative difference"], rows))


def layers_table(result: dict) -> str:
    """`sparse-lower bench --suite layers`: a row per sparse conv of the backbone: its shape and useful
    work, float ms and rate against the same run's GEMM peak, bf16 and int8 ms and their speed-ups; then
    the 5- to 32-channel layers together, every conv, and (in results that have them) the index tables and
    the whole run, rated by the convs' useful work over all its kernels' time."""
    peak = result["peak_gflops"]
    forms = ("float", "bf16", "int8")

    def row(name: str, shape: str, pairs: str, flops: float, ms: dict) -> list[str]:
        rate = [f"{flops / ms['float'] / 1e6:.0f}", f"{100 * flops / ms['float'] / 1e6 / peak:.0f} %"] if flops else ["", ""]
        return [name, shape, pairs, f"{flops / 1e9:.2f}" if flops else "", f"{ms['float']:.1f}", *rate,
                f"{ms['bf16']:.1f}", f"{ms['float'] / ms['bf16']:.2f}×", f"{ms['int8']:.1f}",
                f"{ms['float'] / ms['int8']:.2f}×"]

    def convs(name: str, shape: str, layers: list[dict]) -> list[str]:
        return row(name, shape, f"{sum(layer['pairs'] for layer in layers):,}", sum(layer["flops"] for layer in layers),
                   {form: sum(layer[f"{form}_ms"] for layer in layers) for form in forms})

    layers = result["layers"]
    rows = [convs(layer["layer"], f"{layer['cin']}→{layer['cout']}", [layer]) for layer in layers]
    narrow = [layer for layer in layers if layer["cin"] <= 32]
    rows.append(convs(f"the {len(narrow)} layers of 5–32 channels", "", narrow))
    rows.append(convs("all convs", "", layers))
    if "float_tables_ms" in result:
        rows.append(row("index tables", "", "", 0.0, {form: result[f"{form}_tables_ms"] for form in forms}))
        rows.append(row("whole run", "", "", sum(layer["flops"] for layer in layers),
                        {form: result[f"{form}_ms"] for form in forms}))
    table = markdown_table(["layer", "Cin→Cout", "pairs", "GFLOP", "float ms", "GFLOP/s", "of the GEMM peak",
                            "bf16 ms", "float / bf16", "int8 ms", "float / int8"], rows)
    return captioned(result, f"CenterPoint frame, {result['threads']} threads, {result['units']}; the convs' kernel "
                             f"time in onnxruntime's profile (the mean of {result['repeat']} runs). GEMM peak: "
                             f"onnxruntime's MatMul 2048³ on {result['threads']} threads, {peak:.1f} GFLOP/s (the "
                             f"best before and after the profiles). The whole run's kernels: float "
                             f"{result['float_ms']:.1f} ms, bf16 {result['bf16_ms']:.1f} ms, int8 "
                             f"{result['int8_ms']:.1f} ms.\n\n{table}")


TABLES = {"speed": speed_table, "results": results_table, "scaling": scaling_table, "voxelnext": voxelnext_table,
          "threads": threads_table, "vector-paths": vector_paths_table, "portable": portable_table,
          "nna-tables": nna_tables_table, "toolchains": toolchains_table,
          "kernel-instructions": kernel_instructions_table, "layers": layers_table}
_MARKED = re.compile(r"(?P<open><!-- table (?P<name>[\w-]+): (?P<file>\S+) -->\n)(?P<body>.*?)"
                     r"(?P<close><!-- end of table (?P=name) -->)", re.S)


def marked_tables(text: str) -> list[tuple[str, str, str]]:
    """(name, results file, the table as written) of every marked table of a document."""
    return [(m["name"], m["file"], m["body"].rstrip("\n")) for m in _MARKED.finditer(text)]


def results(path: Path) -> dict | list[dict]:
    """A results file: one JSON document, or (.jsonl) a list of rows, one per line."""
    text = path.read_text()
    return [json.loads(line) for line in text.splitlines()] if path.suffix == ".jsonl" else json.loads(text)


def rendered(text: str, root: Path) -> str:
    """The document with each marked table written anew from its results file."""
    def table(m: re.Match) -> str:
        return m["open"] + TABLES[m["name"]](results(root / m["file"])) + "\n" + m["close"]
    return _MARKED.sub(table, text)
