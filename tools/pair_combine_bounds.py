"""What bounds the pairs combine on a CPU, layer by layer (docs/performance/pair_list.md#not-reached):
each conv layer of the CenterPoint backbone on the real CenterPoint frame, built alone in
standard ops from the reference's own pairs and timed in onnxruntime (2 threads, the variants taking
turns), in three ways of combining the taps:

* `per tap`: the pairs combine as lowered: per tap Gather the paired input rows, MatMul, Gather each
  output's product row, Add over taps (multiplies the useful products only);
* `dense fused`: the taps that pair at least --dense of the outputs gathered side by side per output
  (the zero row where a tap has no pair) and multiplied by one MatMul, the other taps per tap;
* `all fused`: every tap so (the per-level form's `fuse_taps` shape: K·M rows multiplied).

It also counts the rows the output side writes per tap (K gathered [M, Cout] tensors and K−1 Adds)
against a combine that gathers each output only its pairs ranked by pair count (every product row
concatenated, gathered once per rank, padded and added rank by rank, put back in output order).

    python tools/pair_combine_bounds.py [--repeat 7] [--dense 0.55]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from sparse_lower.bench.run import alternating_medians
from sparse_lower.capacity import coords_runs, sparse_nodes
from sparse_lower.frames.sample import real_feeds
from sparse_lower.models import CanonicalEmitter, sp_middle_resnet_fhd
from sparse_lower.onnx_conventions import IR_VERSION, OPSET
from sparse_lower.reference import conv_pairs
from sparse_lower.report import render
from sparse_lower.schemas import conv_channels


def layer_graph(pairs, inputs: int, outputs: int, weights: np.ndarray, fused: list[int]) -> onnx.ModelProto:
    """One conv in standard ops: the taps in `fused` gathered per output side by side and multiplied by
    one MatMul, every other tap as the pairs combine does it; x [inputs, Cin] → y [outputs, Cout]."""
    taps, cin, cout = weights.shape
    inits = {"zero_row": np.zeros((1, cin), np.float32)}
    nodes = [helper.make_node("Concat", ["x", "zero_row"], ["x0"], axis=0)]
    terms = []
    if fused:
        table = np.full((outputs, len(fused)), inputs, np.int64)
        for column, k in enumerate(fused):
            _, sources, targets = pairs[k]
            table[targets, column] = sources
        inits.update(table=table, fused_w=weights[fused].reshape(-1, cout),
                     fused_shape=np.array([outputs, len(fused) * cin], np.int64))
        nodes += [helper.make_node("Gather", ["x0", "table"], ["side_by_side"], axis=0),
                  helper.make_node("Reshape", ["side_by_side", "fused_shape"], ["rows"]),
                  helper.make_node("MatMul", ["rows", "fused_w"], ["fused"])]
        terms.append("fused")
    for k in sorted(set(range(taps)) - set(fused)):
        _, sources, targets = pairs[k]
        position = np.full(outputs, len(sources), np.int64)
        position[targets] = np.arange(len(sources))
        inits.update({f"s{k}": np.append(sources, inputs).astype(np.int64), f"p{k}": position, f"w{k}": weights[k]})
        nodes += [helper.make_node("Gather", ["x0", f"s{k}"], [f"paired{k}"], axis=0),
                  helper.make_node("MatMul", [f"paired{k}", f"w{k}"], [f"product{k}"]),
                  helper.make_node("Gather", [f"product{k}", f"p{k}"], [f"moved{k}"], axis=0)]
        terms.append(f"moved{k}")
    for i in range(1, len(terms)):
        nodes.append(helper.make_node("Add", [terms[i - 1] if i == 1 else f"sum{i - 1}", terms[i]], [f"sum{i}"]))
    nodes.append(helper.make_node("Identity", [f"sum{len(terms) - 1}" if len(terms) > 1 else terms[0]], ["y"]))
    graph = helper.make_graph(nodes, "layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [inputs, cin])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [outputs, cout])],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


def written_rows(pairs, outputs: int) -> tuple[int, int]:
    """Rows the output side writes: per tap (K gathers of M rows, K−1 Adds of M rows) and ranked (P rows
    concatenated and P gathered by rank; ranks after the first padded to the previous rank's length and
    added; M put back in output order)."""
    counts = np.zeros(outputs, np.int64)
    for _, _, targets in pairs:
        counts[targets] += 1
    total = int(counts.sum())
    first_rank = int((counts > 0).sum())
    return len(pairs) * outputs + (len(pairs) - 1) * outputs, 2 * total + 2 * (total - first_rank) + outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--dense", type=float, default=0.55, help="the share of outputs a tap pairs to be fused")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    model = sp_middle_resnet_fhd(CanonicalEmitter(), rng)
    feeds = real_feeds("nuscenes_centerpoint_voxels.npz")
    convs = sparse_nodes(model)
    (coords,) = coords_runs(model, convs, [feeds])
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    rows, totals = [], defaultdict(float)
    for node in convs:
        cin, cout = conv_channels(node.op_type, shapes[node.input[2]])
        coords_name = node.input[1]
        pairs, out = conv_pairs(node, coords[coords_name])
        inputs, outputs, taps = len(coords[coords_name]), len(out), len(pairs)
        useful = sum(len(t) for _, _, t in pairs)
        dense = [k for k, (_, _, t) in enumerate(pairs) if len(t) >= args.dense * outputs]
        weights = rng.standard_normal((taps, cin, cout)).astype(np.float32)
        x = {"x": rng.standard_normal((inputs, cin)).astype(np.float32)}
        variants = {"per tap": [], "dense fused": dense, "all fused": list(range(taps))}
        sessions = {title: ort.InferenceSession(layer_graph(pairs, inputs, outputs, weights, fused).SerializeToString(),
                                                options) for title, fused in variants.items()}
        results = [s.run(None, x)[0] for s in sessions.values()]
        assert all(np.allclose(r, results[0], rtol=1e-4, atol=1e-3) for r in results), node.name
        times = alternating_medians(sessions, x, args.repeat)
        macs = {title: (useful + sum(outputs - len(pairs[k][2]) for k in fused)) / useful
                for title, fused in variants.items()}
        per_tap_rows, ranked_rows = written_rows(pairs, outputs)
        for title in variants:
            totals[title] += times[title]
            totals[title + " macs"] += macs[title] * useful * cin * cout
        totals["useful"] += useful * cin * cout
        totals["per tap rows"] += per_tap_rows * cout
        totals["ranked rows"] += ranked_rows * cout
        rows.append([node.name, f"{outputs:,}", f"{cin}→{cout}", f"{useful / (taps * outputs):.2f}",
                     f"{ranked_rows / per_tap_rows:.2f}", f"{times['per tap']:.1f}",
                     f"{times['dense fused']:.1f} ({len(dense)} taps, {macs['dense fused']:.2f}×)",
                     f"{times['all fused']:.1f} ({macs['all fused']:.2f}×)"])
    print(render(["layer", "outputs", "channels", "pairs / (K·M)", "ranked / per-tap rows written", "per tap ms",
                  "dense fused ms (MACs × useful)", "all fused ms (MACs × useful)"], rows))
    useful = totals["useful"]
    print(f"backbone (the layers summed): per tap {totals['per tap']:.0f} ms (1.00×), dense fused "
          f"{totals['dense fused']:.0f} ms ({totals['dense fused macs'] / useful:.2f}× useful MACs), all fused "
          f"{totals['all fused']:.0f} ms ({totals['all fused macs'] / useful:.2f}×); output-side elements written: "
          f"per tap {totals['per tap rows'] / 1e9:.2f} G, ranked {totals['ranked rows'] / 1e9:.2f} G")
    print(f"onnxruntime {ort.__version__}, 2 threads, median of {args.repeat} runs, the variants taking turns")


if __name__ == "__main__":
    main()
