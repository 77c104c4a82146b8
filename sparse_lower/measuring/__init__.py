"""Measuring runs of a lowered model: medians of timed calls and the session options they use (timing.py),
onnxruntime's profile per op and per layer (profile.py). `sparse_lower.tune` measures with these, and so
does `sparse-lower bench` (bench/), which sits above them."""
