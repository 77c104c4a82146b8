"""spconv 2.x behaviours reproduced in more than one place: by the importers, which read the files
exporters write from spconv modules, and by the reference networks' writers (models/), which write them.

One definition each, so that the reading and the writing cannot drift apart.
"""

from __future__ import annotations

import numpy as np

# torch.nn.LeakyReLU's default slope: the module an exporter fuses into the conv. (spconv's own fused
# activation has act_alpha = 0 by default, which would make a "LeakyReLU" a ReLU.) No sparse-conv format
# in the wild carries the slope, so the writers use this one and the importers assume it.
LEAKY_RELU_ALPHA = 0.01


def runs_as_matmul(kind: str, kernel, stride) -> bool:
    """spconv's 1×1 fast path: a kernel of one tap (and stride 1 unless submanifold; an inverse conv
    module has stride 1) is run as `features @ weight.view(Cin, Cout)` on the input rows."""
    return int(np.prod(kernel)) == 1 and (kind in ("subm", "inverse") or int(np.prod(stride)) == 1)
