"""The benchmark suite (sparse_lower.bench, `sparse-lower bench`): the quick mode end to end."""

from __future__ import annotations

import importlib.util

import json
import sys

import numpy as np
import pytest

from conftest import DATA
from sparse_lower.bench import run
from sparse_lower.bench.cases import all_cases, random_voxels, select
from sparse_lower.cli.main import main as cli_main


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    return out, run(out, quick=True, repeat=2, log=lambda *a: None)


def test_quick_writes_json_markdown_and_plots(quick):
    out, result = quick
    for name in ("results.json", "results.md", "time.png", "gemm_fraction.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    saved = json.loads((out / "results.json").read_text())
    assert [c["case"] for c in saved["cases"]] == [c.name for c in all_cases(quick=True)]
    table = (out / "results.md").read_text()
    assert all(f"| {c['case']}" in table for c in saved["cases"])
    assert saved["gemm_peak_gflops"] > 0


def test_quick_numbers_are_positive(quick):
    _, result = quick
    for case in result["cases"]:
        assert "skipped" not in case, case
        assert case["useful_flops"] > 0 and case["pairs"] > 0 and case["rows_in"] > 0
        for name in ("ours-gpu-unfold", "ours-gpu-rulebook", "ours-nna-gather", "ours-nna-scatter"):
            entry = case["systems"][name]
            assert entry["median_ms"] > 0 and entry["table_ms"] > 0 and entry["gflops"] > 0, (case["case"], name)
        for name, entry in case["systems"].items():  # measured, or skipped with a reason
            assert entry.get("median_ms", 0) > 0 or entry.get("skipped"), (case["case"], name, entry)
        assert case["systems"]["ort-dense"].get("median_ms") or case["group"] == "network"
        if case["group"] == "network":  # peak memory of a fresh process running the network
            assert 50 < case["systems"]["ours-gpu-auto"]["peak_rss_mb"] < 4096, case["systems"]["ours-gpu-auto"]


def test_network_cases_carry_a_profile(quick):
    """Per op and per layer, for the two-thread run; the markdown prints it, with the share of the
    two-thread GEMM peak."""
    out, result = quick
    (network,) = [case for case in result["cases"] if case["group"] == "network"]
    found = network["systems"]["ours-gpu-auto-2threads"]["profile"]
    assert found["by_op"]["IndexedConv"] > 0 and "SubmanifoldMap" in found["by_op"]
    assert abs(sum(found["by_layer"].values()) - found["total_ms"]) < 1e-6 * found["total_ms"] + 1e-9
    assert {"enc1", "dec1"} <= set(found["by_layer"]), "layers are the lowering's node-name prefixes"
    assert result["gemm_peak_2threads_gflops"] > 0
    table = (out / "results.md").read_text()
    assert f"Profile of {network['case']}, ours-gpu-auto-2threads" in table and "two-thread GEMM peak" in table
    assert result["numpy_gemm_gflops"] > 0


def test_systems_agree_on_output_rows(quick):
    _, result = quick
    for case in result["cases"]:
        assert isinstance(case["rows_out"], int), case  # one value: every system made the same rows


def test_minkowski_runs_or_says_why(quick):
    _, result = quick
    try:
        import MinkowskiEngine  # noqa: F401
    except Exception:
        for case in result["cases"]:
            assert "MinkowskiEngine" in case["systems"]["minkowski-0.5.4"]["skipped"]
    else:
        assert any("median_ms" in case["systems"]["minkowski-0.5.4"] for case in result["cases"])


def test_missing_spconv_is_skipped_with_reason(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "spconv", None)  # import spconv… now raises ImportError
    monkeypatch.setitem(sys.modules, "spconv.pytorch", None)
    for loaded in ("sparse_lower.exporter.spconv_calls", "sparse_lower.models.spconv_emitter"):
        monkeypatch.delitem(sys.modules, loaded, raising=False)  # imported earlier, they would hold spconv
    result = run(tmp_path, quick=True, cases="2d,unet", repeat=1, log=lambda *a: None)
    assert len(result["cases"]) == 2
    for case in result["cases"]:
        entry = case["systems"]["spconv-2.3.8"]
        assert "median_ms" not in entry and "spconv" in entry["skipped"], entry
        assert case["systems"]["ours-gpu-unfold"]["median_ms"] > 0
    assert "skip [" in (tmp_path / "results.md").read_text()


def test_useful_flops_count_the_real_pairs(tmp_path):
    """2 · pairs · Cin · Cout with pairs = the 3×3 neighbours (self included) that are active."""
    result = run(tmp_path, quick=True, cases="subm16-16/2d", repeat=1, log=lambda *a: None)
    (case,) = result["cases"]
    coords, _, _ = random_voxels((100, 100), 0.1, np.random.default_rng(0), None)
    active = {tuple(c) for c in coords[:, 1:]}
    pairs = sum((y + dy, x + dx) in active for y, x in active for dy in (-1, 0, 1) for dx in (-1, 0, 1))
    assert case["pairs"] == pairs
    assert case["useful_flops"] == 2.0 * pairs * 16 * 16


def test_select_patterns():
    names = [c.name for c in select(all_cases(), "subm64,unet/*")]
    assert names and all("subm64" in n or n.startswith("unet/") for n in names)
    assert len(select(all_cases(), None)) == len(all_cases())


def test_cli_bench_registered(tmp_path, capsys):
    assert cli_main(["bench", "--quick", "--cases", "2d", "--repeat", "1", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "results.md").is_file()
    assert "subm16-16/2d-100x100-90%" in capsys.readouterr().out


def test_a_run_whose_cases_are_all_skipped_still_reports(tmp_path, monkeypatch):
    from sparse_lower.bench.run import run

    monkeypatch.chdir(tmp_path)  # no shared data from here
    monkeypatch.delenv("SPARSE_LOWER_DATA", raising=False)
    result = run(out=tmp_path / "out", cases="subm16-16/centerpoint", repeat=1, log=lambda *_: None)
    assert all("skipped" in case for case in result["cases"])
    assert (tmp_path / "out" / "results.md").exists()


@pytest.mark.skipif(not (DATA / "nuscenes_centerpoint_voxels.npz").exists(), reason="shared data absent")
@pytest.mark.parametrize("count", [5_000, 150_000])
def test_scaled_frames_look_like_the_real_one(count):
    """Fewer voxels: a subset of the real frame (its local density kept); more: turned copies added."""
    from sparse_lower.bench.cases import scaled_frame
    from sparse_lower.frames.sample import load_voxels

    _, coords, grid = load_voxels(DATA / "nuscenes_centerpoint_voxels.npz")
    scaled = scaled_frame(coords, grid, count)
    assert scaled.shape == (count, 4) and len(np.unique(scaled, axis=0)) == count
    assert (scaled[:, 0] == 0).all() and (scaled[:, 1:] >= 0).all() and (scaled[:, 1:] < np.array(grid)).all()
    assert (np.diff(scaled[:, 1] * grid[1] * grid[2] + scaled[:, 2] * grid[2] + scaled[:, 3]) > 0).all(), "sorted"
    real = {tuple(row) for row in coords[:, 1:].tolist()}
    inside = sum(tuple(row) in real for row in scaled[:, 1:].tolist())
    assert inside == count if count < len(coords) else inside > 0.5 * len(coords)


def test_scaling_plot_and_option(tmp_path):
    from sparse_lower.bench.run import SCALING_SYSTEMS, scaling_plot
    from sparse_lower.cli.main import parser

    cases = [{"case": f"centerpoint/{n}k", "group": "scaling", "rows_in": n * 1000,
              "systems": {name: {"median_ms": float(n * (i + 1)), "peak_rss_mb": float(100 + n)}
                          for i, name in enumerate(SCALING_SYSTEMS)}} for n in (10, 20, 40)]
    path = scaling_plot({"systems": list(SCALING_SYSTEMS), "cases": cases}, tmp_path)
    assert path == tmp_path / "scaling.png" and path.stat().st_size > 0
    assert scaling_plot({"systems": [], "cases": []}, tmp_path) is None
    assert parser()[0].parse_args(["bench", "--scaling"]).suite == "scaling"
    assert parser()[0].parse_args(["bench", "--suite", "threads"]).suite == "threads"


def test_layers_per_run_splits_a_profile_by_run(tmp_path):
    """Runs interleaved with other work (a measurement that alternates ours with spconv) are read
    one by one from one profile: every run has every layer, and the runs add up to the whole profile."""
    from sparse_lower.api import lower
    from sparse_lower.bench.cases import QUICK_CAP, network_case
    from sparse_lower.measuring.profile import layers_per_run
    from sparse_lower.measuring.timing import session_options
    from sparse_lower.runtime import create_session

    built = network_case("unet", None, "unet/tiny", ((41, 48, 48), 0.02, QUICK_CAP)).build()
    options = session_options(1)
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "profile")
    session = create_session(lower(built.source), sess_options=options)
    for _ in range(3):
        session.run(None, built.feeds)
    with open(session.end_profiling()) as file:
        events = json.load(file)
    runs = layers_per_run(events)
    assert len(runs) == 3 and all(set(run) == set(runs[0]) for run in runs)
    assert {"enc1", "dec1"} <= set(runs[0]) and all(ms > 0 for run in runs for ms in run.values())
    kernels = sum(e["dur"] for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")) / 1e3
    assert sum(sum(run.values()) for run in runs) == pytest.approx(kernels)


real_frames = pytest.mark.skipif(not (DATA / "nuscenes_bevfusion_voxels.npz").exists(), reason="shared data absent")


@real_frames
def test_the_threads_suite_writes_its_table(tmp_path, monkeypatch, capsys):
    """`--suite threads` on one thread: results.json, and results.md the table the documentation shows;
    spconv on one thread gives our answer."""
    from sparse_lower.bench import threads
    from sparse_lower.bench.tables import TABLES

    monkeypatch.setattr(threads, "thread_counts", lambda: [1])
    assert cli_main(["bench", "--suite", "threads", "--repeat", "1", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "results.md").read_text() == TABLES["threads"](result) + "\n"
    assert result["suite"] == "threads" and result["commit"] and result["cores"]
    for frame, voxels in (("centerpoint", 79_745), ("bevfusion", 17_748)):
        entry = result["frames"][frame]["threads"]["1"]
        assert result["frames"][frame]["voxels"] == voxels and entry["ours_ms"] > 0
        assert entry["spconv_distance"] < 1e-5
    assert "BEVFusion frame, 17,748 voxels" in capsys.readouterr().out


def test_the_threads_suite_counts_powers_of_two_up_to_the_cores():
    from sparse_lower.bench.threads import thread_counts

    assert thread_counts(2) == [1, 2] and thread_counts(16) == [1, 2, 4, 8, 16] and thread_counts(12) == [1, 2, 4, 8]


@real_frames
def test_the_vector_paths_suite_runs_every_path_of_this_cpu():
    """Each path in a process of its own: the widest and AVX2 give the same bits (float and int8), and the
    int8 form's error is as docs/performance.md says."""
    from sparse_lower.bench.tables import vector_paths_table
    from sparse_lower.bench.vector_paths import measure, paths
    from sparse_lower.runtime import vector_units

    result = measure(repeat=1, rounds=1, log=lambda *_: None)
    assert list(result["paths"]) == list(paths()) and result["repeat"] == 1
    assert result["paths"]["widest"]["units"] == vector_units()
    assert result["paths"]["portable"]["units"] == "portable"
    for name, path in result["paths"].items():
        assert path["float_ms"] > 0 and path["int8_ms"] > 0
        if name != "portable":  # the portable loops round without FMA
            assert path["same_bits"] == ["float", "int8"], name
    assert result["convs"] == [20, 21]
    for frame in ("centerpoint", "bevfusion"):
        assert result["accuracy"][frame]["max_error"] < 0.05 and result["accuracy"][frame]["snr_db"] > 25
    assert "| widest (" in vector_paths_table({**result, "cores": 2, "machine": "x"})


@real_frames
def test_the_layers_suite_times_every_conv_of_the_backbone_against_the_gemm_peak():
    """A row per sparse conv of the backbone with its useful work and each form's kernel time, then the
    narrow layers, the index tables and the whole run; the table rates each against the peak measured in
    the same run."""
    from sparse_lower.bench.layers import measure
    from sparse_lower.bench.tables import layers_table

    result = measure(repeat=1, log=lambda *_: None)
    assert len(result["layers"]) == 21 and result["layers"][0]["layer"] == "conv_input"
    assert sum(layer["flops"] for layer in result["layers"]) == pytest.approx(50.91e9, rel=1e-3)
    assert all(layer["float_ms"] > 0 and layer["bf16_ms"] > 0 and layer["int8_ms"] > 0 for layer in result["layers"])
    assert result["peak_gflops"] == max(result["peaks"]) > 0
    for form in ("float", "bf16", "int8"):
        convs = sum(layer[f"{form}_ms"] for layer in result["layers"])
        assert 0 < result[f"{form}_tables_ms"] < result[f"{form}_ms"] - convs
    table = layers_table({**result, "repeat": 1, "cores": 2, "machine": "x"})
    assert "| conv4.4.conv2 | 128→128 |" in table and "| all convs |" in table
    assert "| the 11 layers of 5–32 channels |" in table and "| index tables |" in table and "| whole run |" in table


def test_the_vector_paths_are_the_cpus():
    from sparse_lower.bench.vector_paths import paths

    assert list(paths("avx512-amx")) == ["widest", "vnni", "avx2", "portable"]
    assert list(paths("avx512-vnni")) == ["widest", "avx2", "portable"]
    assert list(paths("avx2")) == ["widest", "portable"]


@real_frames
def test_the_portable_suite_measures_the_three_forms_and_openvino():
    from sparse_lower.bench.portable import OPENVINO, SYSTEMS, measure
    from sparse_lower.bench.tables import portable_table

    result = measure(repeat=1, log=lambda *_: None)
    openvino = [OPENVINO] if importlib.util.find_spec("openvino") else []  # the openvino extra
    for frame in ("centerpoint", "bevfusion"):
        record = result["frames"][frame]
        assert record["difference"] < 1e-5
        assert list(record["systems"]) == [*SYSTEMS, *openvino]
        assert all(entry["median_ms"] > 0 and entry["peak_mb"] > 100 for entry in record["systems"].values())
        split = record["split"]  # every kernel in one part; the unfold multiplies every tap, the pairs fewer
        parts = [split[part] for part in ("products_ms", "unfold_ms", "tables_ms")]
        assert min(parts) > 0 and sum(parts) + split["rest_ms"] == pytest.approx(split["total_ms"])
        assert split["dense_gflop"] > 1.5 * split["pairs_gflop"] > 0
    assert result["peak_gflops"] == max(result["peaks"]) > 0
    assert "every tap at the peak" in portable_table({**result, "cpu": "x", "vector_units": "x", "date": "x",
                                                      "commit": "x", "machine": "x", "cores": 2, "repeat": 1})


@real_frames
def test_the_nna_tables_suite_times_both_forms(monkeypatch):
    """On the BEVFusion frame alone (the suite's other frame takes as long again): both forms give the same
    outputs, and each has a whole run and an index part timed."""
    from sparse_lower.bench import nna_tables
    from sparse_lower.bench.cases import BEVFUSION_FILE

    monkeypatch.setattr(nna_tables, "FRAMES", {"bevfusion": BEVFUSION_FILE})
    result = nna_tables.measure(repeat=1, log=lambda *_: None)
    record = result["frames"]["bevfusion"]
    assert record["voxels"] == 17_748 and record["difference"] < 1e-6
    assert list(record["systems"]) == list(nna_tables.SYSTEMS.values())
    # the standard tables are most of their run, so one run of each (repeat=1) can put the index part
    # above the whole on a loaded machine: only a part far above the whole is wrong
    assert all(1.5 * entry["median_ms"] > entry["tables_ms"] > 0 for entry in record["systems"].values())
