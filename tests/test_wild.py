"""The files real exporters wrote (../shared/data/wild, whose README lists their facts), and files made by
a producer installable from PyPI (aimet-torch) during the test: each through `sparse-lower convert`
with its default options (verification included) and through the Python API, on every target, against
what the producer's own network computes (the expected outputs stored beside the file, or spconv).
And the writers of sparse_lower.models, which must write what these exporters write.

Nothing here is written by sparse_lower's own writers of the formats: those share its reading of them.
"""

from __future__ import annotations

import functools
import json
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import sparse_lower
from aimet_exports import AIMET_NETWORKS, aimet_eager, aimet_export, aimet_sparse_inputs, wrapped_spconv
from conftest import DATA
from helpers import session as lowered_session
from sparse_lower.cli.main import main
from sparse_lower.importers import SOURCE_FORMAT, detect_format, import_model
from sparse_lower.exporter.spconv_calls import spconv_inference
from sparse_lower.runtime import drop_padding, pad_rows
from sparse_lower.models import AimetEmitter, NvidiaEmitter, sp_middle_resnet_fhd

WILD = DATA / "wild"
MODELS = Path(__file__).resolve().parents[1] / "models"  # the sample models, real exports among them
EXPORTS = Path(__file__).parent / "data" / "exports"  # the expected outputs of those exports (README there)
FOREIGN_SAMPLES = ["nvidia_unet.scn.onnx", "aimet_three_layer.aimet.onnx", "autoware_encoder.onnx"]
NVIDIA = WILD / "nvidia_exptool" / "centerpoint.scn.onnx"
AIMET = WILD / "aimet" / "two_layer_spconv.aimet.onnx"
FRAMES = {"centerpoint": DATA / "nuscenes_centerpoint_voxels.npz", "bevfusion": DATA / "nuscenes_bevfusion_voxels.npz"}
LEVELS = (80_000, 70_000, 30_000, 11_000, 9_000)  # both real frames' sites per level, with a margin
TARGETS = {"gpu": {}, "nna": {}, "nna-capacity": {"max_active": 100_000}, "hybrid": {}, "portable": {},
           "portable-levels": {"max_active": LEVELS}}
TOLERANCE = 1e-4  # relative to the largest expected magnitude (the arithmetic order differs, not the numbers)


def need(path: Path) -> Path:
    if not path.is_file():
        pytest.skip(f"no {path} (the wild corpus lives in ../shared/data/wild)")
    return path


@functools.lru_cache(maxsize=None)
def frame(name: str) -> tuple[np.ndarray, np.ndarray]:
    data = np.load(need(FRAMES[name]))
    return data["features"].astype(np.float32), data["coords"].astype(np.int64)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape
    return float(np.abs(got.astype(np.float64) - want).max() / (np.abs(want).max() or 1.0))  # all-zero: absolute


def convert(source: Path, out: Path, target: str, options: dict, capsys) -> str:
    """`sparse-lower convert` as a user runs it: default options (verification on), exit status 0."""
    argv = ["convert", str(source), "-o", str(out), "--target", target.split("-")[0]]
    if "max_active" in options:
        capacity = options["max_active"]
        argv += ["--max-active", ",".join(map(str, capacity)) if isinstance(capacity, tuple) else str(capacity)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the CLI prints them; tests of the notes live in test_importers
        status = main(argv)
    text = capsys.readouterr().out
    assert status == 0 and "verify: ok" in text, text
    return text


def wild_files() -> list[Path]:
    return (sorted(WILD.rglob("*.onnx")) if WILD.is_dir() else []) + [MODELS / name for name in FOREIGN_SAMPLES]


@pytest.mark.parametrize("path", wild_files(), ids=lambda p: p.name)
def test_every_wild_file_is_recognised_and_imports(path):
    """Whatever lands in the corpus: its format is detected, it imports to a valid source-op model, and
    `sparse-lower inspect` says what it is."""
    model = onnx.load(path)
    assert detect_format(model) != SOURCE_FORMAT
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imported = import_model(model)
    onnx.checker.check_model(imported, full_check=True)
    assert any(node.domain == "sparse" for node in imported.graph.node)


# -- NVIDIA's exptool: CenterPoint's backbone ----------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_nvidia_centerpoint_converts_and_matches_spconv_on_both_frames(target, tmp_path, capsys):
    """The file NVIDIA's tool wrote (traced N frozen in, FP16, "ai.onnx" opset 11), converted with the
    command line's defaults and lowered through the Python API, on both real frames (N = 79,745 and
    17,748), against spconv's output of the same network."""
    expected = np.load(need(NVIDIA.with_name("centerpoint.scn.expected.npz")))
    options = TARGETS[target]
    out = tmp_path / f"cp.{target}.onnx"
    convert(NVIDIA, out, target, options, capsys)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file is as its exporter writes it: nothing to note
        imported = sparse_lower.import_model(NVIDIA)
    api = sparse_lower.lower(imported, target=target.split("-")[0], **options)
    for lowered in (onnx.load(out), api):
        session = lowered_session(lowered, threads=0)
        for name in FRAMES:
            features, coords = frame(name)
            (bev,) = session.run(None, pad_rows(lowered, {"0": features, "coords": coords}))  # static form: padded
            assert relative_error(bev, expected[name]) < TOLERANCE, (name, target)


def test_nvidia_import_reports_what_it_changed():
    imported = sparse_lower.import_model(need(NVIDIA))
    report = json.loads({p.key: p.value for p in imported.metadata_props}["sparse_lower.import"])
    assert report["format"] == "nvidia" and report["notes"] == []
    assert report["float16_to_float32"] == ["0", "39"]
    assert report["coords"] == {"coords": {"columns": ["batch", "z", "y", "x"], "extents": [None, 41, 1440, 1440]}}
    declared = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
                for v in [*imported.graph.input, *imported.graph.output]}
    assert declared == {"0": ["N", 5], "coords": ["N", 4], "39": [1, 256, 180, 180]}


def _signature(model: onnx.ModelProto, names: bool = True) -> dict:
    """What a writer must reproduce of a real file: opsets, IR version, producer, the declared graph
    inputs and outputs (name, type, rank, static or not), every node's op, domain, arity and attribute
    names and types, the initializers' names, types and ranks."""
    graph = model.graph

    def value(v):
        dims = v.type.tensor_type.shape.dim
        return (v.name if names else None, v.type.tensor_type.elem_type, len(dims),
                tuple(d.HasField("dim_value") for d in dims))
    return dict(opsets=sorted((o.domain, o.version) for o in model.opset_import), ir=model.ir_version,
                producer=(model.producer_name, model.producer_version) if names else None,
                inputs=[value(v) for v in graph.input], outputs=[value(v) for v in graph.output],
                value_info=sorted(value(v)[1:] for v in graph.value_info),
                nodes=[(n.op_type, n.domain, n.name if names else None, len(n.input), len(n.output),
                        tuple((a.name, a.type) for a in n.attribute),
                        (tuple(n.input), tuple(n.output)) if names else None) for n in graph.node],
                initializers=[(t.name if names else None, t.data_type, len(t.dims)) for t in graph.initializer])


def test_nvidia_writer_writes_what_exptool_writes():
    """NvidiaEmitter's CenterPoint and the file exptool wrote: the same graph, name for name, attribute
    for attribute (values aside: other weights, another traced frame)."""
    real = onnx.load(need(NVIDIA))
    ours = sp_middle_resnet_fhd(NvidiaEmitter(), np.random.default_rng(0))
    assert _signature(ours) == _signature(real)


# -- AIMET's export ------------------------------------------------------------------------------------

def aimet_layers(model: onnx.ModelProto) -> list[dict]:
    """The SparseConv3d layers an AIMET file wraps, read from the file the way AIMET's layer builds them
    (stride, padding, dilation as written; a regular conv), with the weights it holds."""
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    layers = []
    for node in model.graph.node:
        if node.op_type == "SparseConvolution":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            weight, bias = (weights[name] for name in node.input[-2:])
            layers.append(dict(weight=weight, bias=bias, **{k: attrs[k] for k in ("stride", "padding", "dilation")}))
    return layers


def spconv_chain(layers: list[dict], features: np.ndarray, indices: np.ndarray, grid, batch: int) -> np.ndarray:
    """spconv's own network: SparseConv3d after SparseConv3d on the sparse rows, then `.dense()`."""
    spconv = pytest.importorskip("spconv.pytorch", reason="spconv (the `spconv` extra) computes the oracle")
    import torch

    convs = []
    for layer in layers:
        cout, *kernel, cin = layer["weight"].shape
        conv = spconv.SparseConv3d(cin, cout, kernel, stride=layer["stride"], padding=layer["padding"],
                                   dilation=layer["dilation"], bias=True, algo=spconv.ConvAlgo.Native)
        with torch.no_grad():
            conv.weight.copy_(torch.from_numpy(layer["weight"]))
            conv.bias.copy_(torch.from_numpy(layer["bias"]))
        convs.append(conv)
    network = spconv.SparseSequential(*convs)
    with spconv_inference(network):
        x = spconv.SparseConvTensor(torch.from_numpy(features), torch.from_numpy(indices.astype(np.int32)),
                                    list(grid), batch)
        return network(x).dense().numpy()


def aimet_inputs(rng, grid, count, batch=1):
    volume = int(np.prod(grid))
    sites = rng.choice(batch * volume, size=count, replace=False)
    indices = np.column_stack([sites // volume, *np.unravel_index(sites % volume, grid)]).astype(np.int64)
    return rng.standard_normal((count, 3)).astype(np.float32), indices


@pytest.mark.parametrize("target", TARGETS)
def test_aimet_file_converts_and_matches_the_spconv_network_it_wraps(target, tmp_path, capsys):
    """AIMET's file (two CustomSparseConv3DLayer, then ScatterDense): converted with the defaults and
    through the API, on the 4×4×4 grid it was traced on (full, sparse, one site), against spconv running
    the two SparseConv3d the layers wrap."""
    model = onnx.load(need(AIMET))
    layers = aimet_layers(model)
    options = dict(TARGETS[target])
    options.pop("max_active", None)
    out = tmp_path / f"aimet.{target}.onnx"
    convert(AIMET, out, target, options, capsys)
    with pytest.warns(sparse_lower.errors.SparseLowerWarning, match="QNN's converter reads a missing subm as 1"):
        api = sparse_lower.lower(import_model(model), target=target.split("-")[0], **options)
    rng = np.random.default_rng(0)
    for lowered in (onnx.load(out), api):
        session = lowered_session(lowered, threads=0)
        for count in (64, 20, 1):
            features, indices = aimet_inputs(rng, (4, 4, 4), count)
            (dense,) = session.run(None, {"indices": indices, "features": features})
            want = spconv_chain(layers, features, indices, (4, 4, 4), 1)
            np.testing.assert_allclose(dense, want, rtol=1e-5, atol=1e-5)


def test_aimet_writer_writes_what_aimet_writes():
    """AimetEmitter's version of the same two layers and AIMET's file: the same structure (ops, domains,
    arity, attribute names and types, declared inputs and dense value_info, opsets, IR version)."""
    real = onnx.load(need(AIMET))
    layers = aimet_layers(real)
    emitter = AimetEmitter()
    x = emitter.input(3, (4, 4, 4), 1)
    for layer in layers:
        x = emitter.conv(x, "conv", layer["weight"], layer["bias"], stride=layer["stride"], padding=layer["padding"],
                         dilation=layer["dilation"])
    ours = emitter.finish([emitter.dense(x)])
    assert _signature(ours, names=False) == _signature(real, names=False)
    assert [v.name for v in ours.graph.input] == [v.name for v in real.graph.input]
    for mine, theirs in zip(ours.graph.node, real.graph.node):
        attributes = lambda node: {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attributes(mine) == attributes(theirs)


# -- AIMET's exporter itself, installed from PyPI (aimet_exports.py) ------------------------------------

@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
@pytest.mark.parametrize("name", AIMET_NETWORKS)
def test_files_aimet_exports_convert_and_match_its_network(name, bias, tmp_path, capsys):
    """Files made by aimet-torch's own export classes (not by our writer): converted with the command
    line's defaults and lowered through the API for gpu, nna, hybrid and portable, run on sparse inputs, against
    the spconv network AIMET's layers wrap, and (without bias) against AIMET's own forward."""
    source = tmp_path / f"{name}.aimet.onnx"
    network = aimet_export(name, bias, source)
    assert detect_format(onnx.load(source)) == "aimet"
    cin = network.convs[0].sp_conv_3d.in_channels
    rng = np.random.default_rng(1)
    grid, batch, _ = AIMET_NETWORKS[name]
    cases = [aimet_sparse_inputs(rng, name, count, cin) for count in (batch * int(np.prod(grid)) // 3, 1)]
    expected = [wrapped_spconv(network, indices, features, name) for indices, features in cases]
    if not bias:
        for (indices, features), want in zip(cases, expected):
            np.testing.assert_allclose(aimet_eager(network, indices, features), want, rtol=1e-5, atol=1e-5)
    for target in ("gpu", "nna", "hybrid", "portable"):
        out = tmp_path / f"{name}.{target}.onnx"
        convert(source, out, target, {}, capsys)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            api = sparse_lower.lower(import_model(source), target=target)
        one_tap = [str(w.message) for w in caught if "a one-tap conv" in str(w.message)]
        assert len(one_tap) == (name == "three-layers-1x1-strided"), one_tap  # only a stride-1 conv of one tap
        for lowered in (onnx.load(out), api):
            session = lowered_session(lowered, threads=0)
            for (indices, features), want in zip(cases, expected):
                (dense,) = session.run(None, {"indices": indices.astype(np.int64), "features": features})
                assert relative_error(dense, want) < 1e-5, (name, target)


def test_aimet_export_whose_forward_casts_its_inputs(tmp_path, capsys):
    """A forward that casts int64 indices and float64 features before AIMET's wrapper: the Casts sit
    between the graph inputs and the first layer; the import reads the inputs themselves (int64 indices,
    float32 features, as every imported model declares them)."""
    name = "anisotropic-dilated"
    source = tmp_path / "casts.aimet.onnx"
    network = aimet_export(name, True, source, casts=True)
    assert [n.op_type for n in onnx.load(source).graph.node][:2] == ["Cast", "Cast"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        imported = import_model(source)
    assert {v.name: v.type.tensor_type.elem_type for v in imported.graph.input} == \
        {"indices": onnx.TensorProto.INT64, "features": onnx.TensorProto.FLOAT}
    assert "Cast" not in {n.op_type for n in imported.graph.node}
    indices, features = aimet_sparse_inputs(np.random.default_rng(2), name, 40, 4)
    want = wrapped_spconv(network, indices, features, name)
    for target in ("gpu", "nna", "portable"):
        out = tmp_path / f"casts.{target}.onnx"
        convert(source, out, target, {}, capsys)
        (dense,) = lowered_session(onnx.load(out), threads=0).run(
            None, {"indices": indices.astype(np.int64), "features": features})
        assert relative_error(dense, want) < 1e-5, target


# -- the real exports among the sample models (models/, tests/data/exports/README.md) -----------------

def rows_by_site(features: np.ndarray, coords: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows and coordinates in lexicographic order of the coordinates (an engine's row order is its own)."""
    order = np.lexsort(coords.T[::-1])
    return features[order], coords[order].astype(np.int64)


@pytest.mark.parametrize("target", ["gpu", "nna", "hybrid", "portable"])
def test_nvidia_unet_export_with_inverse_transposed_and_leaky_relu(target, tmp_path, capsys):
    """exptool's UNet (inverse convs through two keys, a transposed conv, fused LeakyReLU(0.1) and
    Sigmoid, a 1×1 head, sparse output), with the slope the file cannot carry given at import: the
    output rows and coordinates are spconv's, for batch 1 and 2."""
    source = MODELS / "nvidia_unet.scn.onnx"
    data = np.load(EXPORTS / "nvidia_unet.expected.npz")
    out = tmp_path / f"unet.{target}.onnx"
    assert main(["convert", str(source), "-o", str(out), "--target", target, "--leaky-relu-alpha", "0.1"]) == 0
    text = capsys.readouterr().out
    assert "verify: ok" in text and "does not say its slope" not in text, text
    with pytest.warns(sparse_lower.errors.SparseLowerWarning, match="transposed=1: imported as spconv's"):
        api = sparse_lower.lower(import_model(source, leaky_relu_alpha=0.1), target=target)
    for lowered in (onnx.load(out), api):
        session = lowered_session(lowered, threads=0)
        for batch in ("b1", "b2"):
            features, coords = session.run(None, {"0": data[f"{batch}_features"], "coords": data[f"{batch}_coords"]})
            got, got_coords = rows_by_site(features, coords)
            want, want_coords = rows_by_site(data[f"{batch}_expected"], data[f"{batch}_expected_coords"])
            np.testing.assert_array_equal(got_coords, want_coords)
            assert relative_error(got, want) < 1e-5, (target, batch)


@pytest.mark.parametrize("target, options", [("gpu", {}), ("nna", {}), ("hybrid", {}), ("portable", {}),
                                              ("portable", {"max_active": (8000, 1000)})])
def test_autoware_export_matches_spconv(target, options, tmp_path, capsys):
    """The Autoware writers' encoder (a pair op shared by two SubMs, a strided and a transposed conv,
    `.dense()` in standard ops, as torch.onnx spells it): convert's defaults verify it (the coordinates
    come straight from a graph input), and the dense output, the output rows and their coordinates are
    spconv's. The `.dense()` is read as ToDense, so that no ScatterND is left and the portable static
    form (the transposed conv's 6,824 sites back on level 0, two batches: the ToDense's) takes it."""
    source = MODELS / "autoware_encoder.onnx"
    data = np.load(EXPORTS / "autoware_encoder.expected.npz")
    out = tmp_path / f"autoware.{target}.onnx"
    convert(source, out, target, options, capsys)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing in the file is left open
        api = sparse_lower.lower(import_model(source), target=target, **options)
    for lowered in (onnx.load(out), api):
        assert "ScatterND" not in {n.op_type for n in lowered.graph.node}
        session = lowered_session(lowered, threads=0)
        names = [o.name for o in session.get_outputs()]
        feeds = pad_rows(lowered, {"features": data["features"], "indices": data["indices"]})
        results = drop_padding(dict(zip(names, session.run(None, feeds))))
        assert relative_error(results["dense"], data["dense"]) < 1e-5, target
        got, got_coords = rows_by_site(results["out_features"], results["out_indices"])
        want, want_coords = rows_by_site(data["out_features"], data["out_indices"])
        np.testing.assert_array_equal(got_coords, want_coords)
        assert relative_error(got, want) < 1e-5, target
