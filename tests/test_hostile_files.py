"""Hostile foreign files: the real exports of each format (the wild corpus and the sample models), made
wrong the ways a broken exporter or a careless edit makes them. Each is refused before any work, with a
SparseLowerError naming the node (or the graph input) and the fix: never a crash, a hang or a memory
blow-up. Then a fuzz campaign mutates their attributes and initializers at random, a bounded number of
times, in a process of its own with a memory limit and a deadline: every file either imports, lowers
and runs, or is refused cleanly.

The refusals of hand-written graphs are test_importers' and test_autoware's; refused feeds at run time
test_hostile's.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("SPARSE_LOWER_DATA") or ROOT.parent / "shared" / "data")
FILES = {  # name: (path, the format's first sparse node, its kernel attribute, its grid attribute)
    "nvidia": (DATA / "wild/nvidia_exptool/centerpoint.scn.onnx", "SparseConvolution", "kernel_size",
               "input_spatial_shape"),
    "nvidia-unet": (ROOT / "models/nvidia_unet.scn.onnx", "SparseConvolution", "kernel_size", "input_spatial_shape"),
    "aimet": (DATA / "wild/aimet/two_layer_spconv.aimet.onnx", "SparseConvolution", "kernel_size",
              "input_spatial_shape"),
    "aimet-three": (ROOT / "models/aimet_three_layer.aimet.onnx", "SparseConvolution", "kernel_size",
                    "input_spatial_shape"),
    "autoware": (ROOT / "models/autoware_encoder.onnx", "GetIndicePairsImplicitGemm", "ksize", "spatial_shape"),
}
SPARSE_OPS = {"SparseConvolution", "ScatterDense", "GetIndicePairsImplicitGemm", "ImplicitGemm", "GetIndicePairs",
              "IndiceConv"}


def load(name: str) -> onnx.ModelProto:
    path = FILES[name][0]
    if not path.is_file():
        pytest.skip(f"no {path}")
    return onnx.load(str(path))


def first(model: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    return next(node for node in model.graph.node if node.op_type == op_type)


def with_attribute(node: onnx.NodeProto, name: str, value) -> None:
    """Sets (or with None removes) an attribute."""
    for attribute in [a for a in node.attribute if a.name == name]:
        node.attribute.remove(attribute)
    if value is not None:
        node.attribute.append(helper.make_attribute(name, value))


def first_weight(model: onnx.ModelProto) -> onnx.TensorProto:
    conv = next(n for n in model.graph.node if n.op_type in ("SparseConvolution", "ImplicitGemm", "IndiceConv"))
    weights = {t.name: t for t in model.graph.initializer}
    return next(weights[name] for name in conv.input if name in weights and len(weights[name].dims) == 5)


def narrower_weight(model, name):
    """The first conv's weight with one input channel fewer (or more, where it has one)."""
    weight = first_weight(model)
    value = numpy_helper.to_array(weight)
    narrower = value[..., :-1] if value.shape[-1] > 1 else value.repeat(2, -1)
    weight.CopyFrom(numpy_helper.from_array(narrower, weight.name))


# mutation: (how it is made, what the refusal names: "node" or "input")
MUTATIONS = {
    "missing kernel": (lambda m, n: with_attribute(first(m, FILES[n][1]), FILES[n][2], None), "node"),
    "kernel as floats": (lambda m, n: with_attribute(first(m, FILES[n][1]), FILES[n][2], [3.0, 3.0, 3.0]), "node"),
    "kernel as a string": (lambda m, n: with_attribute(first(m, FILES[n][1]), FILES[n][2], "3,3,3"), "node"),
    "kernel of 0": (lambda m, n: with_attribute(first(m, FILES[n][1]), FILES[n][2], [0, 3, 3]), "node"),
    "weight of another shape": (narrower_weight, "node"),
    "dangling input": (lambda m, n: m.graph.node[1].input.__setitem__(0, "nowhere"), "node"),
    "duplicated output": (lambda m, n: m.graph.node[1].output.__setitem__(0, m.graph.node[0].output[0]), "node"),
    "duplicated graph input": (lambda m, n: m.graph.input.append(m.graph.input[0]), "input"),
    "cycle": (lambda m, n: m.graph.node[0].input.__setitem__(0, m.graph.node[-1].output[0]), "node"),
    "2 GB declared dimension": (lambda m, n: setattr(m.graph.input[0].type.tensor_type.shape.dim[0], "dim_value",
                                                     1 << 31), "input"),
}
INT8_MUTATIONS = {  # NVIDIA's INT8 exports carry their calibrated ranges on the convs
    "int8 input range of 0": (lambda m, n: with_attribute(first(m, FILES[n][1]), "input_dynamic_range", 0.0), "node"),
    "int8 input range of NaN": (lambda m, n: with_attribute(first(m, FILES[n][1]), "input_dynamic_range",
                                                             float("nan")), "node"),
    "int8 weight ranges of NaN": (lambda m, n: with_attribute(first(m, FILES[n][1]), "weight_dynamic_ranges",
                                                               [float("nan")] * 16), "node"),
}


def int64_bias(model, name):
    """Autoware's biases are Adds after the convs: one of them made int64."""
    add = first(model, "Add")
    bias = next(t for t in model.graph.initializer if t.name in add.input)
    bias.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(bias).astype(np.int64), bias.name))


def wider_indices(model, name):
    """The coordinates input declared with a column too many."""
    indices = next(v for v in model.graph.input if v.name == "indices")
    indices.type.tensor_type.shape.dim[1].dim_value += 1


AUTOWARE_MUTATIONS = {"int64 bias on a standard Add": (int64_bias, "node"),
                      "indices of a column too many": (wider_indices, "node")}
CASES = [(name, mutation) for name in FILES for mutation in MUTATIONS] + \
        [(name, mutation) for name in ("nvidia", "nvidia-unet") for mutation in INT8_MUTATIONS] + \
        [("autoware", mutation) for mutation in AUTOWARE_MUTATIONS]


def import_and_lower(model: onnx.ModelProto, target: str = "gpu") -> onnx.ModelProto:
    import sparse_lower
    from sparse_lower.importers import import_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sparse_lower.lower(import_model(model, leaky_relu_alpha=0.1), target=target)


@pytest.mark.parametrize("name, mutation", CASES, ids=[f"{n}: {m}" for n, m in CASES])
def test_a_hostile_file_is_refused_naming_the_node_and_the_fix(name, mutation):
    from sparse_lower.errors import SparseLowerError

    model = load(name)
    mutate, named = {**MUTATIONS, **INT8_MUTATIONS, **AUTOWARE_MUTATIONS}[mutation]
    mutate(model, name)
    with pytest.raises(SparseLowerError) as raised:
        import_and_lower(model)
    error = raised.value
    assert error.reason and error.fix, str(error)
    if named == "node":
        assert error.node in {node.name for node in model.graph.node}, str(error)
    else:
        assert f"'{model.graph.input[0].name}'" in error.reason, str(error)


@pytest.mark.parametrize("name", ["nvidia", "aimet", "aimet-three", "autoware"])
def test_a_grid_of_2_to_the_40_cells_is_refused_where_a_dense_output_would_hold_it(name):
    """The first layer's grid made 2^14 × 2^13 × 2^13: the layers after it, and the densified output, no
    longer agree with it."""
    from sparse_lower.errors import SparseLowerError

    model = load(name)
    with_attribute(first(model, FILES[name][1]), FILES[name][3], [1 << 14, 1 << 13, 1 << 13])
    with pytest.raises(SparseLowerError, match="contradicts the grid") as raised:
        import_and_lower(model)
    assert raised.value.node and raised.value.fix


def test_a_consistent_grid_of_2_to_the_40_cells_takes_no_memory_of_its_size():
    """NVIDIA's UNet (no dense output) with its first grid made 2^14 × 2^13 × 2^13: the index tables grow
    with the sites, not the grid, so it lowers and runs; a ToDense of such a grid is refused (test_errors)."""
    from sparse_lower.runtime import create_session
    from sparse_lower.verify import example_inputs

    model = load("nvidia-unet")
    with_attribute(first(model, "SparseConvolution"), "input_spatial_shape", [1 << 14, 1 << 13, 1 << 13])
    lowered = import_and_lower(model)
    feeds = example_inputs(lowered, np.random.default_rng(0), active=40)
    outputs = create_session(lowered).run(None, feeds)
    assert all(np.isfinite(o).all() for o in outputs if o.dtype == np.float32)


# -- the fuzz campaign ----------------------------------------------------------------------------------

def mutated_attribute(attribute: onnx.AttributeProto, rng: random.Random) -> onnx.AttributeProto | None:
    """A random wrong value for an attribute (None: remove it)."""
    choice = rng.randrange(8)
    if choice == 0:
        return None
    if choice == 1:
        return helper.make_attribute(attribute.name, "fuzz")
    if choice == 2:
        return helper.make_attribute(attribute.name, [float("nan"), 1.5])
    if attribute.type == onnx.AttributeProto.INTS or choice == 3:
        length = rng.choice([0, 1, 2, 3, 3, 3, 4, 6])
        values = [rng.choice([-1, 0, 1, 2, 3, 7, 1 << 20, 1 << 31, 1 << 62]) for _ in range(length)]
        return helper.make_attribute(attribute.name, values or [0])
    if attribute.type == onnx.AttributeProto.INT or choice == 4:
        return helper.make_attribute(attribute.name, rng.choice([-5, 0, 1, 2, 3, 1 << 40]))
    if attribute.type == onnx.AttributeProto.FLOAT:
        return helper.make_attribute(attribute.name, rng.choice([float("nan"), float("inf"), -1.0, 0.0]))
    if attribute.type == onnx.AttributeProto.STRING:
        return helper.make_attribute(attribute.name, rng.choice(["", "ReLU ", "zyxw", "None", "\x00"]))
    return helper.make_attribute(attribute.name, rng.choice([[1.0], [-2.0, 3.0]]))


def mutated_tensor(tensor: onnx.TensorProto, rng: random.Random) -> onnx.TensorProto:
    """A random wrong initializer of the same name: another shape, a NaN, another type, or nothing in it."""
    value = numpy_helper.to_array(tensor)
    choice = rng.randrange(4)
    if choice == 0 and value.size > 1:
        value = value.reshape(-1)[: value.size // 2]
    elif choice == 1 and value.dtype.kind == "f" and value.size:
        value = value.copy()
        value.reshape(-1)[0] = np.nan
    elif choice == 2:
        value = value.astype(np.int64 if value.dtype.kind == "f" else np.float32)
    else:
        value = np.zeros((0,), value.dtype)
    return numpy_helper.from_array(value, tensor.name)


def mutated_input(value: onnx.ValueInfoProto, rng: random.Random) -> str:
    """A graph input declared another way: another element type, rank or extent."""
    tensor = value.type.tensor_type
    choice = rng.randrange(3)
    if choice == 0:
        tensor.elem_type = rng.choice([onnx.TensorProto.INT32, onnx.TensorProto.DOUBLE, onnx.TensorProto.STRING])
        return f"input {value.name} of type {tensor.elem_type}"
    if choice == 1:
        tensor.shape.dim.add().dim_value = 2
        return f"input {value.name} of rank {len(tensor.shape.dim)}"
    if not tensor.shape.dim:
        return f"input {value.name} unchanged"
    tensor.shape.dim[rng.randrange(len(tensor.shape.dim))].dim_value = rng.choice([0, 1, 5, 1 << 40])
    return f"input {value.name} of shape {[d.dim_value or d.dim_param for d in tensor.shape.dim]}"


def mutated(model: onnx.ModelProto, rng: random.Random) -> tuple[onnx.ModelProto, str]:
    """The model with one to three things made wrong: an attribute of a node (a sparse one more often),
    an initializer or a graph input's declaration; what was changed."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    changes = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        sparse = [n for n in model.graph.node if n.op_type in SPARSE_OPS and n.attribute]
        nodes = sparse if rng.random() < 0.8 else [n for n in model.graph.node if n.attribute]
        draw = rng.random()
        if draw < 0.6 and nodes:
            node = rng.choice(nodes)
            index = rng.randrange(len(node.attribute))
            replacement = mutated_attribute(node.attribute[index], rng)
            changes.append(f"{node.name}.{node.attribute[index].name} -> "
                           f"{helper.printable_attribute(replacement) if replacement else 'removed'}")
            del node.attribute[index]
            if replacement is not None:
                node.attribute.append(replacement)
        elif draw < 0.85:
            tensor = rng.choice(model.graph.initializer)
            tensor.CopyFrom(mutated_tensor(tensor, rng))
            changes.append(f"initializer {tensor.name}")
        else:
            changes.append(mutated_input(rng.choice(model.graph.input), rng))
    return model, "; ".join(changes)


def campaign(seed: int, count: int) -> list[dict]:
    """`count` mutations of the real files; each outcome "ok", "refused" (a SparseLowerError with a fix,
    or our kernels refusing the frame by name) or "crash" with what happened."""
    import onnxruntime as ort

    from sparse_lower.errors import SparseLowerError
    from sparse_lower.runtime import create_session
    from sparse_lower.verify import example_inputs

    rng = random.Random(seed)
    sources = {name: onnx.load(str(path)) for name, (path, *_) in FILES.items() if path.is_file()}
    outcomes = []
    for _ in range(count):
        name = rng.choice(sorted(sources))
        model, what = mutated(sources[name], rng)
        outcome = {"file": name, "mutation": what}
        try:
            lowered = import_and_lower(model)
            feeds = example_inputs(lowered, np.random.default_rng(0), active=30)
            create_session(lowered).run(None, feeds)
            outcome["outcome"] = "ok"
        except SparseLowerError as error:
            outcome["outcome"] = "refused" if error.fix else "crash"
            outcome["message"] = str(error)[:300]
        except (ort.capi.onnxruntime_pybind11_state.InvalidArgument, ort.capi.onnxruntime_pybind11_state.Fail) as error:
            # our kernels' checks at run time (a frame the model cannot take): the op names itself; or one
            # of the file's own standard ops, as the mutation left it, failing under its own name
            ours = any(f"{op}: " in str(error) for op in ("Map", "IndexedConv", "SiteIndex", "IndexedFold",
                                                          "IndexedUnfold", "ActiveSites", "PairRows"))
            named = re.search(r"Name:'([^']*)'", str(error))
            theirs = named and named.group(1) in {n.name for n in model.graph.node if n.op_type not in SPARSE_OPS}
            outcome["outcome"] = "refused" if ours or theirs else "crash"
            outcome["message"] = str(error)[:300]
        except Exception as error:  # anything else is a crash of ours
            outcome["outcome"] = "crash"
            outcome["message"] = f"{type(error).__name__}: {str(error)[:300]}"
        outcomes.append(outcome)
    return outcomes


FUZZ_COUNT = 500
FUZZ_MEMORY = 4 << 30  # bytes of address space the campaign's process may take
FUZZ_DEADLINE = 600  # seconds


def test_a_fuzz_campaign_on_the_real_files_refuses_cleanly(tmp_path):
    """FUZZ_COUNT random mutations, in a process of its own under a memory limit and a deadline: every
    outcome is a clean refusal or a model that lowers and runs; a blow-up would end the process."""
    done = subprocess.run([sys.executable, __file__, str(FUZZ_COUNT)], capture_output=True, text=True,
                          timeout=FUZZ_DEADLINE, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])})
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(outcomes) == FUZZ_COUNT
    crashes = [o for o in outcomes if o["outcome"] == "crash"]
    assert not crashes, json.dumps(crashes[:5], indent=1)
    assert {o["outcome"] for o in outcomes} >= {"refused"}


if __name__ == "__main__":  # the campaign's own process
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (FUZZ_MEMORY, FUZZ_MEMORY))
    print(json.dumps(campaign(seed=int(os.environ.get("FUZZ_SEED", 20261127)), count=int(sys.argv[1]))))
