"""Passes over ONNX models, and the manager that runs them."""
