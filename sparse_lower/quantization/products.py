"""The products by a weight in an accelerator segment (what int8 quantizes), the layers they belong to,
and the network's first and last layers (kept float, or wide, by every quantized form)."""

from __future__ import annotations

import re

import networkx as nx
import onnx

from ..partition.segments import NodeGraph


def _multiplies_by_a_weight(node: onnx.NodeProto, stored: set[str]) -> bool:
    return node.op_type == "Conv" or (node.op_type == "MatMul" and node.input[1] in stored)


def weight_products(model: onnx.ModelProto) -> list[str]:
    """The nodes that multiply by a stored weight: Conv, and MatMul whose right operand is an initializer."""
    stored = {t.name for t in model.graph.initializer}
    return [node.name for node in model.graph.node if _multiplies_by_a_weight(node, stored)]


def first_and_last_products(graph: NodeGraph) -> set[str]:
    """The weight products of the network's first and last layers, by the partition's node names: those
    with no other weight product upstream, or none downstream on the partition's data-flow graph (so any
    naming and any number of branches). Empty when that would be every product (a network of one or
    two layers): int8 means quantizing them."""
    products = {i for i in graph.dag if _multiplies_by_a_weight(graph.nodes[i], graph.initializers)}

    def behind_a_product(flow: nx.DiGraph) -> set[int]:
        """The nodes with a product upstream in `flow` (one topological pass, not a search per node)."""
        behind: set[int] = set()
        for i in nx.topological_sort(flow):
            if any(other in behind or other in products for other in flow.pred[i]):
                behind.add(i)
        return behind

    after, before = behind_a_product(graph.dag), behind_a_product(graph.dag.reverse(copy=False))
    edges = (products - after) | (products - before)
    return {graph.names[i] for i in edges} if edges != products else set()


def activations_read(model: onnx.ModelProto, products: list[str]) -> list[str]:
    """The activations (first inputs) that the nodes named in `products` read, sorted."""
    named = set(products)
    return sorted({node.input[0] for node in model.graph.node if node.name in named})


def layer_of(product: str) -> str:
    """The layer (source conv) of a product node: the lowering names a layer's products `LAYER/tapK/OP`
    (one per tap), or `LAYER/OP` (one for all taps: fuse_taps, the unfold combine)."""
    return re.sub(r"/tap\d+/.*$|/[^/]*$", "", product)


def layer_products(products: list[str]) -> dict[str, list[str]]:
    """The products by layer (`layer_of`)."""
    layers: dict[str, list[str]] = {}
    for product in products:
        layers.setdefault(layer_of(product), []).append(product)
    return layers
