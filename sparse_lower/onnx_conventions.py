"""The ONNX conventions the whole package follows, each defined here once.

* Domains: the source ops live in `SOURCE_DOMAIN` ("sparse", docs/source_ops.md), the library's custom
  ops in `CUSTOM_DOMAIN` ("sparse_lower", docs/custom_ops.md). ONNX spells its default domain two
  ways, "" and "ai.onnx" (NVIDIA's exports declare the second); `model_io.load` rewrites the second to
  the first, so code after loading may compare with "". A check that can meet a model that was not
  loaded, or an onnx-graphsurgeon node (whose domain may be None), asks `is_standard`.
* IR version: every model the package writes carries `IR_VERSION` (10). onnx.helper stamps newer ones
  than onnxruntime reads (1.21, the oldest runtime supported, reads up to 10; 1.31 up to 13).
* Opset: `OPSET` (17) for the default domain of every model the package writes, and the version an
  import converts older exports to (the imported forms need opset 13 or later: Reshape with a shape
  input, …).
* Metadata: the keys of `metadata_props` the package writes, all under "sparse_lower.": what produced a
  lowered model and with which options, how to run it, its sparse layers for the cost report, and an
  imported model's report of what the import did.
"""

from __future__ import annotations

SOURCE_DOMAIN = "sparse"
CUSTOM_DOMAIN = "sparse_lower"
DEFAULT_DOMAIN_ALIAS = "ai.onnx"
STANDARD_DOMAINS = ("", DEFAULT_DOMAIN_ALIAS)
IR_VERSION = 10
OPSET = 17
# The most elements one tensor of a model may hold: 2^31, 8 GiB of float32. A declared graph input or output
# (a traced row count, a dense grid) or a ToDense output past it is refused: every random input drawn for the
# model, and every run, would allocate it.
MAX_TENSOR_ELEMENTS = 2 ** 31

VERSION_KEY = "sparse_lower.version"  # the package version that lowered the model
OPTIONS_KEY = "sparse_lower.options"  # the lowering's target and options (JSON)
RUNTIME_KEY = "sparse_lower.runtime"  # how to run the lowered model (its custom ops need the library)
LAYERS_KEY = "sparse_lower.layers"  # the source model's sparse layers, for the cost report (JSON)
GRIDS_KEY = "sparse_lower.grids"  # the grid each coordinate input is read on (JSON)
IMPORT_KEY = "sparse_lower.import"  # an imported model's report of what the import did (JSON)


def is_standard(domain: str | None) -> bool:
    """Whether `domain` is ONNX's default domain, in any spelling (None: onnx-graphsurgeon's)."""
    return domain is None or domain in STANDARD_DOMAINS
