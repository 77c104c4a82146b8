"""sparse-lower inspect."""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ..api import load
from ..capacity import level_and_pair_rows, most_members
from ..errors import SparseLowerError
from ..frames.files import feeds_of, read_frames
from ..importers import SOURCE_FORMAT, detect_format, format_title, import_model, nothing_to_lower
from ..layer_costs import costed_sites, layer_costs, method_table
from ..lowering.portable import index_memory
from ..model_io import recorded_options
from ..onnx_conventions import CUSTOM_DOMAIN, DEFAULT_DOMAIN_ALIAS, SOURCE_DOMAIN
from ..schemas import CONV_OPS, conv_channels, conv_geometry
from ..report import render
from .active import add_active_argument
from .convert import no_voxels
from .counts import count
from .op_counts import op_counts
from .verbosity import Verbosity


def _with_margin(percent: float, count: int) -> int:
    """A measured count grown by `percent`, rounded up: a capacity for frames like the measured ones."""
    return math.ceil(count * (1 + percent / 100))


def _shape(value: onnx.ValueInfoProto) -> str:
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in
            value.type.tensor_type.shape.dim]
    dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name
    return f"{dtype}{dims}"


def sparse_layers(model: onnx.ModelProto) -> list[list]:
    """One row per sparse conv: geometry, channels, grids and parameters."""
    weights = {t.name: t for t in model.graph.initializer}
    rows = []
    for node in model.graph.node:
        if node.domain != SOURCE_DOMAIN or node.op_type not in CONV_OPS:
            continue
        g = conv_geometry(node)
        w = weights.get(node.input[2])
        shape = list(w.dims) if w is not None else None
        cin, cout = conv_channels(node.op_type, shape) if shape else ("?", "?")
        params = sum(int(np.prod(weights[i].dims)) for i in node.input[2:4] if i in weights)
        target = " (target coords)" if node.op_type == "SparseDeconv" and len(node.input) > 4 and node.input[4] else ""
        rows.append([node.name, node.op_type + target, "x".join(map(str, g.kernel_shape)),
                     ",".join(map(str, g.strides)), ",".join(map(str, g.pads)), ",".join(map(str, g.dilations)),
                     f"{cin}->{cout}", "x".join(map(str, g.spatial_shape)), "x".join(map(str, g.output_shape)), params])
    return rows


class InspectCommand:
    """Describe an ONNX model: inputs, outputs, op counts, sparse layers, costs and parameters.

    Works on source models (lists every SubmanifoldConv / SparseConv / SparseDeconv with its kernel,
    strides, pads, dilations, channels, input and output grid and parameter count), on lowered
    models (lists the sparse_lower custom ops and the index tables they share) and on the exports
    `convert` imports (NVIDIA Lidar_AI_Solution, AIMET): it names the format, then describes the
    imported model's layers.

    The cost table gives each sparse conv's multiply-accumulates (millions) per method at --active N
    sites (outputs taken as N too; by default the model's max_active for its first level, else 500),
    for M output sites, N input sites, K kernel taps and Cin -> Cout channels:
      gpu      the custom ops' products, M*K*Cin*Cout;
      matmul   the nna target's 1x1 convs, K*N*Cin*Cout, plus moving each tap's products to the outputs
               by multiplying with an M x N scatter matrix, K*M*N*Cout;
      scatter  the same 1x1 convs, plus adding each tap's products into the outputs, K*N*Cout;
      gather   the same 1x1 convs, plus gathering each output's products per tap, K*M*Cout;
      dense    a dense conv over the whole grid, B*Hout*Wout*K*Cin*Cout.

    For the portable target it lists the index tensors whose size follows the grid (a site grid per
    input extent, the marks that find each strided or transposed conv's output sites) with the most
    bytes each takes per batch; a site grid holds 8 bytes per column cell plus 4 per depth cell of each
    occupied column, the most being every column occupied.

    --frames runs the model (gpu target) on the given frames and prints the active sites of every level
    (level 0: the input sites; each SparseConv's outputs start the next; a SparseDeconv goes back to its
    targets' level) and the --max-active per level that holds them, for `convert --target nna`; then
    the pairs of every kernel tap of every named sparse conv, the most over the frames, which is what
    the nna pairs combine multiplies (`convert --combine pairs --max-pairs FILE`; --max-pairs-out FILE
    writes them there).

    example: sparse-lower inspect model.onnx --active 80000
             sparse-lower inspect models/centerpoint_head.onnx --frames ../shared/data
                 --max-pairs-out pairs.json
    """

    name = "inspect"

    @staticmethod
    def add_arguments(parser):
        parser.add_argument("input", help="ONNX model")
        add_active_argument(parser)
        parser.add_argument("--batch", type=count(1), default=1, help="batch for the dense cost")
        parser.add_argument("--frames", nargs="+", metavar="FRAME",
                            help=".npz frames (features, coords) or folders of them: the active sites of every "
                                 "level on them, and the --max-active per level they need")
        parser.add_argument("--margin", type=float, default=0.0, metavar="PERCENT",
                            help="with --frames: capacities that hold this many percent more than measured (default 0)")
        parser.add_argument("--max-pairs-out", metavar="FILE",
                            help="with --frames: write the pairs per tap of every conv as JSON, for convert "
                                 "--combine pairs --max-pairs FILE")

    def run(self, args, out: Verbosity) -> int:
        if (args.max_pairs_out or args.margin) and not args.frames:
            flag = "--max-pairs-out" if args.max_pairs_out else "--margin"
            raise SparseLowerError(f"{flag} is about the capacities measured on --frames",
                                   fix="give --frames FRAME [FRAME ...] with it")
        if not (math.isfinite(args.margin) and args.margin >= 0):
            raise SparseLowerError(f"--margin {args.margin} is not a percentage >= 0", fix="give e.g. --margin 10")
        frames = read_frames(args.frames) if args.frames else []  # read before any work
        model = load(args.input)
        graph = model.graph
        initializers = {t.name for t in graph.initializer}
        opsets = ", ".join(f"{o.domain or DEFAULT_DOMAIN_ALIAS}:{o.version}" for o in model.opset_import)
        print(f"model: {args.input} (IR {model.ir_version}, opsets {opsets})")
        print(render(["input", "type"], [[v.name, _shape(v)] for v in graph.input if v.name not in initializers]))
        print(render(["output", "type"], [[v.name, _shape(v)] for v in graph.output]))
        print(render(["op", "count"], sorted(op_counts(model).items())))
        model = self._imported(model, out)
        if model is None:
            return 0
        graph = model.graph
        tuned = recorded_options(model).get("layer_strategies")
        if tuned:
            print("compute form chosen per conv (convert --tune): " +
                  ", ".join(f"{conv} {form}" for conv, form in tuned.items()))
        layers = sparse_layers(model)
        if layers:
            print(render(["sparse layer", "op", "kernel", "strides", "pads", "dilations", "channels", "grid in",
                          "grid out", "params"], layers))
        memory = index_memory(graph)
        if memory:
            print("index memory of the portable target's static form (max_active; the dynamic form's follows the "
                  "frame), per batch:")
            print(render(["index tensor", "extent", "at most"],
                         [[what, "x".join(map(str, extent)), f"{size / 2**20:,.1f} MiB"] for what, extent, size in memory]))
        costs = layer_costs(model)
        if costs:
            sites, said = costed_sites(model, args.active)
            print(f"MACs (millions) at {said}, batch {args.batch}:")
            print(method_table(costs, sites, args.batch))
        custom = [n for n in graph.node if n.domain == CUSTOM_DOMAIN]
        if custom:
            print(render(["custom op", "inputs", "outputs"],
                         [[f"{n.name} ({n.op_type})", ", ".join(n.input), ", ".join(n.output)] for n in custom]))
        parameters = sum(int(np.prod(numpy_helper.to_array(t).shape)) for t in graph.initializer)
        print(f"parameters: {parameters:,}")
        if frames:
            feeds = feeds_of(model, frames)
            if all(no_voxels(model, frame) for frame in feeds):
                said = "the frame has no voxels" if len(feeds) == 1 else f"none of the {len(feeds)} frames has voxels"
                raise SparseLowerError(f"--frames: {said}, so there is no capacity to measure",
                                       fix="give --frames frames that have voxels, as the model will run on")
            grown = partial(_with_margin, args.margin)
            rows, pairs = level_and_pair_rows(model, feeds)
            self._levels(rows, len(frames), grown, out)
            members = most_members(model, feeds)
            if members is not None:
                print(f"the most rows one Coalesce site merges on them: --max-members {grown(members)}")
            self._pairs(pairs, grown, args.max_pairs_out)
        return 0

    @staticmethod
    def _levels(rows: list[int], frames: int, grown, out: Verbosity) -> None:
        """The most active sites per level over the frames, and the capacity per level that holds them."""
        out.say(render(["level", "active sites (most, over the frames)"],
                       [[level, f"{n:,}"] for level, n in enumerate(rows)]))
        capacities = ",".join(str(max(grown(n), 1)) for n in rows)  # a level no frame reached still needs a valid one
        count = f"{frames} frame{'' if frames == 1 else 's'}"
        print(f"on {'this' if frames == 1 else 'these'} {count}: --max-active {capacities} ({grown.args[0]:g} % "
              f"margin; other frames may need more)")

    @staticmethod
    def _pairs(measured: dict[str, list[int]], grown, path: str | None) -> None:
        """The most pairs per tap of every named conv over the frames: the pairs combine's capacities."""
        pairs = {name: [grown(n) for n in counts] for name, counts in measured.items()}
        print(f"pairs per kernel tap (most over the frames, plus {grown.args[0]:g} %; what --combine pairs multiplies, "
              f"in the kernel's row-major tap order):")
        print(render(["sparse layer", "pairs", "per tap"], [[name, f"{sum(counts):,}", ",".join(map(str, counts))]
                                                             for name, counts in pairs.items()]))
        if path:
            Path(path).write_text(json.dumps(pairs, indent=1) + "\n")
            print(f"wrote {path}: convert --target nna --combine pairs --max-pairs {path}, with the capacities per "
                  f"level above")

    @staticmethod
    def _imported(model: onnx.ModelProto, out: Verbosity) -> onnx.ModelProto | None:
        """The model whose layers to list: a foreign export imported (saying so), else the model itself;
        None, after saying why, when there is nothing sparse_lower can take."""
        found = detect_format(model)
        if found == SOURCE_FORMAT:  # lowered: custom ops, or standard ops only with the options recorded
            if not recorded_options(model) and not any(n.domain == CUSTOM_DOMAIN for n in model.graph.node):
                reason = nothing_to_lower(model)
                if reason:
                    print(reason)
            return model
        out.say(f"format: {format_title(found)} export; `sparse-lower convert` imports it (into source ops) "
                f"before lowering. The layers below are the imported model's.")
        try:
            return import_model(model)
        except SparseLowerError as error:
            print(f"the import refuses it: {error}")
            return None
