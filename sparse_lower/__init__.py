"""sparse_lower: lower sparse convolutions in ONNX graphs for onnxruntime and accelerators."""
