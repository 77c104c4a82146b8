"""The benchmark (`sparse-lower bench`): single sparse layers on the real CenterPoint frame, on uniform
random voxels and on the patent's 2D images, and the reference networks on the real frames, for our
lowered forms (gpu unfold / rulebook, nna gather / scatter), spconv 2.3.8 and onnxruntime's dense Conv
(run.py says how it measures); and the suites with tables of their own (suites.py).

A measuring harness, not part of the compiler: `import sparse_lower` never loads it (nor the reference
networks it builds), `sparse-lower bench` imports it when it runs."""

from .run import run

__all__ = ["run"]
