"""`sparse_lower.export`: a PyTorch module traced to a source-op ONNX model, then checked (export.py).

One step of the layout per concern: trace.py traces the module with torch.onnx, picking the engine;
traced_calls.py is what every engine's replaced calls share (a call's results handed to the trace, the
origin of signed coordinates, the default bound); one module per engine (spconv_calls.py with
spconv_modules.py, minkowski_calls.py, torchsparse_calls.py) and per framework above one
(pointcept_calls.py) says what its calls become; cleanup.py tidies the traced graph; refusals.py words
what the module does that the model cannot carry. The readers of ONNX files other tools wrote are in
importers/.
"""

from .export import export

__all__ = ["export"]
