"""The lowering's cost model: multiply-accumulates of each sparse conv layer under each lowering
method (the patent's cost equations), so a user can see what a target and combine method cost before
running anything (`inspect`'s table, and `sparse_lower.partition`'s summary, which hands it to the
partitioner: the partitioner knows no lowering).

With N active input sites, M output sites, K taps, Cin → Cout channels:

* gpu: M·K·Cin·Cout, the unfold's; an upper bound for the default `IndexedConv`, which multiplies
  only the pairs that exist (the rulebook about 1.04× them), a number known only at run time;
* nna, all methods: the 1×1 convs, K·N·Cin·Cout, plus the combine:
  method 1, `matmul`: K·M·N·Cout (the scatter-matrix products; the patent's K·N²·Cout for M = N);
  method 2, `scatter`: K·N·Cout additions; `gather`: K·M·Cout additions;
* dense convolution of the whole grid: B·Π(output grid)·K·Cin·Cout.

The layers are read from the source ops, or from the `sparse_lower.layers` metadata a lowered model
carries (the lowering writes it), so lowered and partitioned models report them too.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from math import prod

import onnx

from .assumed_active import assumed_active
from .onnx_conventions import LAYERS_KEY, SOURCE_DOMAIN
from .report import render
from .model_io import recorded_options
from .schemas import CONV_OPS, conv_channels, conv_geometry, coords_levels

METHODS = ("gpu", "matmul", "scatter", "gather", "dense")


@dataclass(frozen=True)
class LayerCost:
    name: str
    op_type: str
    taps: int
    cin: int
    cout: int
    output_sites: int  # per batch: the output grid's volume
    same_sites: bool  # a SubmanifoldConv: M = N
    level: int = 0  # the level of its input sites (schemas.coords_levels): which capacity holds them

    def macs(self, active: int, outputs: int | None = None, batch: int = 1) -> dict[str, int]:
        """MACs per method for `active` input sites and `outputs` output sites (M = N when unknown)."""
        n = active
        m = n if outputs is None or self.same_sites else outputs
        k, cin, cout = self.taps, self.cin, self.cout
        convs = k * n * cin * cout
        return {"gpu": m * k * cin * cout, "matmul": convs + k * m * n * cout, "scatter": convs + k * n * cout,
                "gather": convs + k * m * cout, "dense": batch * self.output_sites * k * cin * cout}


def layer_costs(model: onnx.ModelProto) -> list[LayerCost]:
    """The sparse conv layers of a source model, or those recorded in a lowered model's metadata."""
    recorded = next((p.value for p in model.metadata_props if p.key == LAYERS_KEY), None)
    if recorded is not None:
        return [LayerCost(**layer) for layer in json.loads(recorded)]
    weights = {t.name: list(t.dims) for t in model.graph.initializer}
    levels = coords_levels(model.graph)
    layers = []
    for node in model.graph.node:
        if node.domain != SOURCE_DOMAIN or node.op_type not in CONV_OPS or node.input[2] not in weights:
            continue
        geometry = conv_geometry(node)
        shape = weights[node.input[2]]
        cin, cout = conv_channels(node.op_type, shape)
        layers.append(LayerCost(node.name, node.op_type, geometry.volume, cin, cout, prod(geometry.output_shape),
                                node.op_type == "SubmanifoldConv", levels.get(node.input[1], 0)))
    return layers


def record(model: onnx.ModelProto, layers: list[LayerCost]) -> None:
    """Write the layers into the model's metadata (what `layer_costs` reads back)."""
    onnx.helper.set_model_props(model, {**{p.key: p.value for p in model.metadata_props},
                                        LAYERS_KEY: json.dumps([asdict(layer) for layer in layers])})


def method_table(layers: list[LayerCost], active: int | list[int], batch: int = 1) -> str:
    """A table: per layer its name, op, then MACs per method (in millions) at `active` sites (M = N): one
    count, or one per level (the last for deeper levels), each layer at its input level's."""
    def sites(layer: LayerCost) -> int:
        return active[min(layer.level, len(active) - 1)] if isinstance(active, list) else active

    rows = [[layer.name, layer.op_type,
             *(f"{value / 1e6:,.1f}" for value in layer.macs(sites(layer), batch=batch).values())] for layer in layers]
    return render(["sparse layer", "op", *METHODS], rows)


def costed_sites(model: onnx.ModelProto, active: int | None = None) -> tuple[int | list[int], str]:
    """The sites to price the layers at, and how to say them: `active` where given, else the capacities the
    model was lowered with, one per level where it has several (a deep level holds far fewer sites than
    the input's: pricing it at the input's overstates it), else `assumed_active`."""
    if active:
        return active, f"{active:,} active sites"
    capacities = recorded_options(model).get("max_active")
    if isinstance(capacities, list) and len(capacities) > 1:
        return capacities, f"each level's capacity (max_active {','.join(map(str, capacities))})"
    active = assumed_active(model)
    return active, f"{active:,} active sites"


def method_report(model: onnx.ModelProto, active: int | None = None) -> str | None:
    """The sparse layers' `method_table` under its heading, at `costed_sites`; None for a model without
    sparse layers. What a partition's summary appends."""
    layers = layer_costs(model)
    if not layers:
        return None
    sites, said = costed_sites(model, active)
    return f"sparse layers, MACs (millions) per method at {said}:\n{method_table(layers, sites)}"
