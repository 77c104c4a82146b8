"""LowerSparse: rewrite every source node with the rules of a target (docs/lowered_forms.md)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import onnx
import onnx_graphsurgeon as gs

from ..errors import SparseLowerError
from ..layer_costs import layer_costs, record
from ..lowering import LoweringContext, Options, compute_policy, default_batches, index_tables, rule_for
from ..lowering.graph import deep_graph, model_like
from ..lowering.portable import padding_reader
from ..input_roles import input_grids
from ..runtime import needs_library
from ..onnx_conventions import CUSTOM_DOMAIN, GRIDS_KEY, OPSET, OPTIONS_KEY, RUNTIME_KEY, SOURCE_DOMAIN, VERSION_KEY
from ..schemas import MERGE_OPS, coords_levels
from ..version import VERSION

# The oldest default-domain opset whose ops the lowering emits: Unsqueeze with an axes input (13) for
# gpu; Shape with start/end (15) and ScatterElements with reduction="add" (16) for nna; portable writes
# one documented opset, 17 (docs/portable.md).
MIN_OPSET = {"gpu": 13, "nna": 16, "hybrid": 16, "portable": OPSET}


def source_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == SOURCE_DOMAIN]


def run_hint(model: str = "model", library: bool = True) -> str:
    """How to run a lowered `model`, which needs the `library` or not: onnxruntime alone only says its
    custom ops are not registered."""
    if not library:
        return f"standard ONNX ops only: any ONNX runtime runs {model} as it is, no library needed"
    return (f"needs the sparse_lower custom-op library: sparse_lower.create_session({model}), or in any "
            f"onnxruntime session SessionOptions.register_custom_ops_library(sparse_lower.get_library_path())")


class LowerSparse:
    """requires: source nodes every rule's check accepts (ValidateSourceOps); a default-domain opset the emitted ops exist in and onnx knows
    (a model importing none gets opset 17); for the portable static form, no op but a source op or a
    row-wise one reading sparse rows (which carry padding there). ensures: no `sparse` node is left; the
    model imports the `sparse_lower` domain where a node of it is left (none in a portable model, nor in
    an nna one with standard tables)."""

    def __init__(self, target: str, options: Options):
        self.target = target
        self.options = options
        self.name = f"lower-{target}"
        self.step = f"lowering for the {target} target"

    def requires(self, model: onnx.ModelProto) -> None:
        opset = next((o.version for o in model.opset_import if o.domain == ""), None)
        # standard tables are the portable target's, written at its one documented opset
        minimum = MIN_OPSET["portable" if self.options.tables == "standard" else self.target]
        if opset is not None and opset < minimum:
            what = f"{self.target} lowering" + (" with standard tables" if self.options.tables == "standard" else "")
            raise SparseLowerError(f"the model imports ONNX opset {opset}; the {what} emits opset-{minimum} ops",
                                   fix="convert the model with onnx.version_converter first")
        newest = onnx.defs.onnx_opset_version()
        if opset is not None and opset > newest:  # the ops emitted at that opset have no known schema
            raise SparseLowerError(f"the model imports ONNX opset {opset}, newer than the newest that onnx "
                                   f"{onnx.__version__} knows ({newest})",
                                   fix=f"export the model at opset {newest} or older")
        if self.target == "portable" and self.options.max_active is not None:
            merging = next((n for n in source_nodes(model) if n.op_type in MERGE_OPS), None)
            if merging is not None:
                raise SparseLowerError(f"the portable static form (max_active) does not take {merging.op_type} yet",
                                       merging.name or merging.op_type,
                                       "lower for the portable target without max_active, or for nna with max_active")
            found = padding_reader(model.graph)
            if found is not None:
                node, tensor = found
                raise SparseLowerError(
                    f"the portable static form (max_active) pads every sparse tensor with rows of coords -1, and "
                    f"the {node.op_type} node reads the rows of '{tensor}' as they are", node.name or node.op_type,
                    "densify with the source op ToDense (it leaves the padding out), or lower without max_active")

    def call(self, model: onnx.ModelProto) -> onnx.ModelProto:
        options = self.options
        if self.target == "portable" and options.max_active is not None and options.max_batch is None:
            # read here, after the passes before this one made a `.dense()` in standard ops a ToDense
            options = replace(options, max_batch=default_batches(model.graph))
        graph = gs.import_onnx(model)
        # import_onnx shares the model's opset imports, to which export_onnx appends the custom domain:
        # a copy leaves the caller's model as it was (model_like writes the imports)
        graph.import_domains = list(graph.import_domains)
        with deep_graph(graph):
            graph.toposort()
        ctx = LoweringContext(graph, compute_policy(self.target, options),
                              index_tables(self.target, model.graph, options), coords_levels(model.graph))
        for node in list(graph.nodes):
            rule = rule_for(node)
            if rule is not None:
                rule.rewrite(node, ctx)
        with deep_graph(graph):
            graph.cleanup().toposort()
        imports = [(CUSTOM_DOMAIN, 1)] if any(node.domain == CUSTOM_DOMAIN for node in graph.nodes) else []
        if not any(o.domain == "" for o in model.opset_import):
            imports.append(("", OPSET))
        lowered = model_like(graph, model, drop_domains=(SOURCE_DOMAIN,), add_domains=imports)
        self._stamp(lowered, model, options)
        return lowered

    def _stamp(self, lowered: onnx.ModelProto, source: onnx.ModelProto, options: Options) -> None:
        """Record what produced the model, how to run it (onnxruntime alone only says its custom ops are
        not registered functions), the grid of each coordinate input (checked against frames), and its
        sparse layers for the cost report."""
        recorded = {"target": self.target, **asdict(options)}
        onnx.helper.set_model_props(lowered, {**{p.key: p.value for p in lowered.metadata_props},
                                              VERSION_KEY: VERSION,
                                              OPTIONS_KEY: json.dumps(recorded),
                                              RUNTIME_KEY: run_hint(library=needs_library(lowered)),
                                              GRIDS_KEY: json.dumps(input_grids(source))})
        record(lowered, layer_costs(source))

    def ensures(self, model: onnx.ModelProto) -> None:
        left = source_nodes(model)
        if left:
            raise SparseLowerError(f"{len(left)} source nodes were not lowered", left[0].name)
        if self.target == "nna" and self.options.tables == "standard":
            custom = next((n for n in model.graph.node if n.domain == CUSTOM_DOMAIN), None)
            if custom is not None:
                raise SparseLowerError(f"the nna lowering with standard tables left the custom op {custom.op_type}",
                                       custom.name, "report it: every nna custom op has a standard form")
