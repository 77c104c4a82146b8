"""The benchmark driver: every case × every system, side by side in one process, written as
`results.json`, `results.md` and two plots (`time.png`, `gemm_fraction.png`) into an output folder.

Per case all systems are prepared (lowered, sessions created, one warm-up run each), then timed
round-robin `repeat` times so that the machine's drift hits them alike; the median is reported.
Times include the kernel maps / index tables, as in real inference; for our systems the index part
alone (the model cut to its feature-independent nodes) is timed in the same rounds.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import time
import traceback
from pathlib import Path

import numpy as np

from ..errors import SparseLowerError
from ..report import markdown_table, render
from ..runtime import vector_units
from .cases import Skip, all_cases, scaling_cases, select
from .memory import peak_rss_mb
from .systems import default_systems, gemm_peak_gflops, numpy_gemm_peak_gflops
from .provenance import provenance_fields
from ..measuring.timing import median_of, timed


# measured on network cases; a fitted nna system's peak includes measuring its capacities on the frame
MEMORY_SYSTEMS = ("ours-gpu-auto", "ours-gpu-auto-2threads", "spconv-2.3.8", "ours-nna-levels-2threads",
                  "ours-nna-pairs-2threads", "ours-portable-2threads", "pointcept-torch-1thread",
                  "pointcept-torch-2threads")
PROFILED_SYSTEM = "ours-gpu-auto-2threads"  # how a user runs it; its profile is printed for network cases
SCALING_SYSTEMS = ("ours-gpu-auto", "ours-gpu-auto-2threads", "spconv-2.3.8", "minkowski-0.5.4",
                   "ours-nna-levels-2threads", "ours-nna-pairs-2threads")


def run_case(case, systems, repeat: int, log=print, quick: bool = False) -> dict:
    record = {"case": case.name, "group": case.group, "description": case.description, "systems": {}}
    log("  building the case's model and frame…")
    try:
        built = case.build()
    except Skip as reason:
        record["skipped"] = str(reason)
        log(f"  case skipped: {reason}")
        return record
    record.update(rows_in=built.rows_in, grid=list(built.grid), note=built.note)
    prepared = {}
    for system in systems:
        entry = record["systems"].setdefault(system.name, {})
        log(f"  preparing {system.name}…")
        try:
            start = time.perf_counter()
            prepared[system.name] = system.prepare(built)
            entry["prepare_s"] = round(time.perf_counter() - start, 3)
        except (Skip, ImportError) as reason:
            entry["skipped"] = str(reason)
        except Exception as error:  # a failing system must not stop the suite; say what happened
            entry["skipped"] = f"failed: {type(error).__name__}: {error}"
            entry["traceback"] = traceback.format_exc(limit=3)
    samples = {name: [] for name in prepared}
    table_samples = {name: [] for name, p in prepared.items() if p.table is not None}
    for name, p in prepared.items():  # warm-up of the table models
        if p.table is not None:
            p.table()
    for round_ in range(repeat):
        log(f"  timing round {round_ + 1} of {repeat}…")
        for name, p in prepared.items():
            samples[name].append(timed(p.run))
            if p.table is not None:
                table_samples[name].append(timed(p.table))
    flops = next((p.flops for p in prepared.values() if p.flops is not None), None)
    pairs = next((p.pairs for p in prepared.values() if p.pairs is not None), None)
    record.update(useful_flops=flops, pairs=pairs)
    for name, p in prepared.items():
        entry = record["systems"][name]
        entry["median_ms"] = median_of(samples[name])
        entry["runs_ms"] = [round(s * 1e3, 3) for s in samples[name]]
        if name in table_samples:
            entry["table_ms"] = median_of(table_samples[name])
        if p.rows_out is not None:
            entry["rows_out"] = p.rows_out
        if p.note:
            entry["note"] = p.note
        if flops:
            entry["gflops"] = flops / (entry["median_ms"] / 1e3) / 1e9
    if case.group == "network" and PROFILED_SYSTEM in prepared:
        record["systems"][PROFILED_SYSTEM]["profile"] = prepared[PROFILED_SYSTEM].profile()
    rows = {e.get("rows_out") for e in record["systems"].values() if e.get("rows_out") is not None}
    record["rows_out"] = rows.pop() if len(rows) == 1 else sorted(rows) or None
    del prepared, built
    gc.collect()
    if case.group in ("network", "scaling"):
        for name in MEMORY_SYSTEMS:
            entry = record["systems"].get(name, {})
            if "median_ms" in entry:
                entry["peak_rss_mb"] = peak_rss_mb(case.name, name, quick)
    return record


def markdown(result: dict) -> str:
    systems = result["systems"]
    peak = result["gemm_peak_gflops"]
    header = ["case", "rows in → out", "useful GFLOP"] + systems
    rows = []
    notes: dict[str, int] = {}

    def footnote(text: str) -> str:
        notes.setdefault(text, len(notes) + 1)
        return f"[{notes[text]}]"

    for rec in result["cases"]:
        if "skipped" in rec:
            rows.append([rec["case"], *["–"] * (len(header) - 2), f"– {footnote(rec['skipped'])}"])
            continue
        rows_out = rec.get("rows_out")
        rows_out = f"{rows_out:,}" if isinstance(rows_out, int) else ("dense" if rows_out is None else str(rows_out))
        flops = rec.get("useful_flops")
        cells = [rec["case"] + (f" {footnote(rec['note'])}" if rec.get("note") else ""),
                 f"{rec['rows_in']:,} → {rows_out}", f"{flops / 1e9:.3g}" if flops else "?"]
        for name in systems:
            entry = rec["systems"].get(name, {})
            if "median_ms" not in entry:
                cells.append("skip " + footnote(entry.get("skipped", "not run")))
                continue
            cell = f"{entry['median_ms']:,.1f}"
            if "table_ms" in entry:
                cell += f" (idx {entry['table_ms']:,.1f})"
            if "gflops" in entry and name != "ort-dense":
                cell += f" · {100 * entry['gflops'] / peak:.1f}%"
            if isinstance(entry.get("peak_rss_mb"), float):
                cell += f" · {entry['peak_rss_mb'] / 1024:.2f} GiB"
            cells.append(cell)
        rows.append(cells)
    # the peers of two threads (TorchSparse only where a case ran it: results before it keep their text)
    two = "ours-gpu-auto-2threads, minkowski and torchsparse" if any(
        "median_ms" in r.get("systems", {}).get("torchsparse-1.4.0", {}) for r in result["cases"]) else \
        "ours-gpu-auto-2threads and minkowski"
    if any("median_ms" in r.get("systems", {}).get("pointcept-torch-2threads", {}) for r in result["cases"]):
        two += ", pointcept-torch-2threads (spconv's layers on 1)"
    text = [f"Median ms of {result['repeat']} runs after a warm-up, 1 thread each except "
            f"{two} (2), one process ({result['machine']}); (idx …) = the index tables "
            f"alone; · % = useful GFLOP/s (2·pairs·Cin·Cout) as a fraction of the measured single-core "
            f"GEMM peak {peak:.1f} GFLOP/s (onnxruntime MatMul 2048³, its best run); · GiB = peak resident memory of a "
            f"fresh process running the network once (networks only). ort-dense = dense Conv of the "
            f"whole grid (densify not timed; it computes every site, not only the useful pairs).",
            "", markdown_table(header, rows), ""]
    text += [f"[{n}] {t}" for t, n in notes.items()]
    return "\n".join(text + profiles(result)) + "\n"


def profiles(result: dict, layers: int = 8) -> list[str]:
    """Markdown lines: for each profiled case, its kernel time per op type and in its slowest layers, and
    its useful GFLOP/s against the two-thread GEMM peaks (onnxruntime's MatMul; numpy's on every core)."""
    lines = []
    peak = result.get("gemm_peak_2threads_gflops")
    for rec in result["cases"]:
        entry = rec.get("systems", {}).get(PROFILED_SYSTEM, {})
        if "profile" not in entry:
            continue
        found = entry["profile"]
        flops = rec.get("useful_flops")
        useful = flops / entry["median_ms"] / 1e6 if flops else None
        rate = (f"; {useful:.1f} useful GFLOP/s, {100 * useful / peak:.0f} % of onnxruntime's two-thread GEMM peak "
                f"{peak:.1f} GFLOP/s" if useful and peak else "")
        if useful and result.get("numpy_gemm_gflops"):
            rate += (f", {100 * useful / result['numpy_gemm_gflops']:.0f} % of numpy's {result['numpy_gemm_gflops']:.1f} "
                     f"({result['cores']} cores)")
        lines += ["", f"Profile of {rec['case']}, {PROFILED_SYSTEM} ({entry['median_ms']:,.1f} ms a run{rate}): "
                      f"kernel ms per run, by op and in the {layers} slowest layers", "",
                  "```text", render(["op", "ms", "%"], [[op, f"{ms:.1f}", f"{100 * ms / found['total_ms']:.0f}"]
                                                     for op, ms in found["by_op"].items()]), "",
                  render(["layer", "ms"], [[layer, f"{ms:.1f}"] for layer, ms in list(found["by_layer"].items())[:layers]]),
                  "```"]
    return lines


def plots(result: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [r for r in result["cases"] if "skipped" not in r]
    systems = result["systems"]
    peak = result["gemm_peak_gflops"]
    written = []
    if not cases:  # everything skipped (e.g. no shared data): the JSON and markdown say why
        return written
    for key, fname, label, scale in (("median_ms", "time.png", "median time per run (ms, log)", True),
                                     ("gflops", "gemm_fraction.png",
                                      f"useful GFLOP/s / single-core GEMM peak ({peak:.1f} GFLOP/s)", False)):
        fig, ax = plt.subplots(figsize=(10, max(3.0, 0.45 * len(cases) * max(1, len(systems)) / 3)))
        height = 0.8 / max(1, len(systems))
        y = np.arange(len(cases))
        for i, name in enumerate(systems):
            values = []
            for rec in cases:
                v = rec["systems"].get(name, {}).get(key)
                if v is not None and key == "gflops":
                    v = v / peak if name != "ort-dense" else None
                values.append(np.nan if v is None else v)
            ax.barh(y + i * height, values, height, label=name)
        ax.set_yticks(y + 0.4 - height / 2)
        ax.set_yticklabels([r["case"] for r in cases], fontsize=7)
        ax.invert_yaxis()
        if scale:
            ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def scaling_plot(result: dict, out: Path) -> Path | None:
    """scaling.png: time and peak memory against active voxels per system (log-log), and our speed-up
    from one thread to two."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [r for r in result["cases"] if r.get("group") == "scaling" and "skipped" not in r]
    if not cases:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for name in result["systems"]:
        for ax, key in zip(axes[:2], ("median_ms", "peak_rss_mb")):
            points = [(r["rows_in"], r["systems"][name][key]) for r in cases
                      if isinstance(r["systems"].get(name, {}).get(key), float)]
            if points:
                ax.plot(*zip(*points), marker="o", label=name)
    speedup = [(r["rows_in"], r["systems"]["ours-gpu-auto"]["median_ms"] / r["systems"]["ours-gpu-auto-2threads"]["median_ms"])
               for r in cases if all("median_ms" in r["systems"].get(n, {}) for n in SCALING_SYSTEMS[:2])]
    if speedup:
        axes[2].plot(*zip(*speedup), marker="o", label="ours-gpu-auto: 1 thread / 2 threads")
    for ax, label in zip(axes, ("median time per run (ms)", "peak resident memory (MiB)", "speed-up")):
        ax.set_xscale("log")
        if ax is not axes[2]:
            ax.set_yscale("log")
        ax.set_xlabel("active voxels")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.suptitle("CenterPoint backbone on real-frame-like voxel sets")
    fig.tight_layout()
    path = out / "scaling.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def selected_cases(cases: str | None, quick: bool = False, scaling: bool = False) -> list:
    """The cases `--cases` names (all where it is None); a pattern that names none is refused, with the
    names there are."""
    available = scaling_cases() if scaling else all_cases(quick)
    selected = select(available, cases)
    if not selected:
        raise SparseLowerError(f"--cases {cases!r} matches none of the {'scaling ' if scaling else ''}cases",
                               fix=f"give names or globs of: {', '.join(c.name for c in available)}")
    return selected


def run(out="bench_results", quick: bool = False, cases: str | None = None, repeat: int | None = None,
        nna_max_rows: int | None = 50_000, log=print, scaling: bool = False) -> dict:
    """Run the suite (with `scaling`: the scaling curves instead); returns the result dict (also written
    to `out`)."""
    selected = selected_cases(cases, quick, scaling)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    repeat = repeat or (3 if quick else 5)
    systems = [s for s in default_systems(nna_max_rows) if not scaling or s.name in SCALING_SYSTEMS]
    log("measuring the single-core GEMM peak…")
    peak = gemm_peak_gflops(512 if quick else 2048, 3 if quick else 9)
    peak2 = gemm_peak_gflops(512 if quick else 2048, 3 if quick else 9, threads=2)
    blas = numpy_gemm_peak_gflops(512 if quick else 2048, 3 if quick else 9)
    log(f"  {peak:.1f} GFLOP/s (two threads: {peak2:.1f}; numpy on {os.cpu_count()} cores: {blas:.1f})")
    result = {"machine": f"{platform.machine()}, {platform.processor() or platform.system()}, our kernels on "
                         f"{vector_units()}", **provenance_fields(),
              "repeat": repeat, "quick": quick, "gemm_peak_gflops": peak, "gemm_peak_2threads_gflops": peak2,
              "numpy_gemm_gflops": blas, "cores": os.cpu_count(),
              "systems": [s.name for s in systems], "cases": []}
    for case in selected:
        log(f"{case.name}")
        start = time.perf_counter()
        record = run_case(case, systems, repeat, log, quick)
        record["case_s"] = round(time.perf_counter() - start, 1)
        result["cases"].append(record)
        for name, entry in record.get("systems", {}).items():
            log(f"  {name:18s} " + (f"{entry['median_ms']:10.1f} ms" + (f"  idx {entry['table_ms']:.1f} ms"
                                                                         if "table_ms" in entry else "")
                                    if "median_ms" in entry else f"skipped: {entry.get('skipped')}"))
        (out / "results.json").write_text(json.dumps(result, indent=1))  # partial results survive a crash
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "results.md").write_text(markdown(result))
    pictures = [path for path in [scaling_plot(result, out)] if path] if scaling else plots(result, out)
    result["files"] = [str(out / "results.json"), str(out / "results.md")] + [str(p) for p in pictures]
    log(render(["file"], [[f] for f in result["files"]]))
    return result
