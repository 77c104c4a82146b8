"""Foreign files after the tools users run on models before deploying (tools/tool_variants.py: onnxsim,
onnxslim, polygraphy's sanitize --fold-constants, onnxconverter-common's float16 with and without
keep_io_types, onnx.version_converter to opsets 13, 17 and 18, onnx.save with external data,
onnx.compose's prefix). Each file of the wild corpus, each sample model and fresh exports by aimet-torch
(the real exporter, installed from PyPI), after each tool, imports and computes what the original file
computes within 1e-4 on gpu, nna and hybrid: sparse_lower.reference on the original (after a float16
tool, on the original with its weights rounded to half: the network the tool wrote). Where the tool
itself fails on the file, it fails as recorded in TOOL_FAILURES (docs/formats.md: Files after other
tools), and `sparse-lower convert` verifies what the tool wrote."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import onnx
import pytest

from aimet_exports import AIMET_NETWORKS, aimet_export
from helpers import load_tool
from sparse_lower.cli.main import main

variants = load_tool("tool_variants")

for package in ("onnxsim", "onnxslim", "polygraphy", "onnxconverter_common"):
    pytest.importorskip(package, reason=f"{package} is not installed: pip install '.[test]'")


def check(original: onnx.ModelProto, path: Path, tool: str, options: dict) -> None:
    """The variant at `path` imports and computes what `original` (imported) computes, on every target."""
    feeds = variants.example_feeds(original)
    want = variants.expected(original, tool, feeds)
    model = variants.imported(path, options)
    for target in variants.TARGETS:
        got = variants.lowered_outputs(model, target, original, feeds)
        error = variants.worst_error(got, want)
        assert error <= variants.TOLERANCE, (path.name, tool, target, error)


@pytest.mark.parametrize("tool", variants.TOOLS)
@pytest.mark.parametrize("name", variants.FILES)
def test_files_after_each_tool(name, tool, tmp_path, capsys):
    source = variants.location(name)
    if not source.is_file():
        pytest.skip(f"no {source}")
    failure = variants.TOOL_FAILURES.get((name, tool))
    if failure is not None:  # the tool's own failure on this file: recorded, not worked around
        with pytest.raises(Exception, match=re.escape(failure)):
            variants.variant(name, tool, tmp_path)
        return
    path = variants.variant(name, tool, tmp_path)
    check(variants.imported(source, variants.FILES[name]), path, tool, variants.FILES[name])
    if name.startswith("models/"):  # the command line verifies what the tool wrote, as a user runs it
        argv = ["convert", str(path), "-o", str(tmp_path / "out.onnx")]
        if "leaky_relu_alpha" in variants.FILES[name]:
            argv += ["--leaky-relu-alpha", str(variants.FILES[name]["leaky_relu_alpha"])]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            status = main(argv)
        text = capsys.readouterr().out
        assert status == 0 and "verify: ok" in text, text


@pytest.mark.parametrize("tool", variants.TOOLS)
@pytest.mark.parametrize("network", ["equal-zero-biases", "anisotropic-dilated"])
def test_fresh_aimet_exports_after_each_tool(network, tool, tmp_path):
    """aimet-torch's export of a network with two bias-less layers of equal width (their zero biases
    stored once, read through an Identity) and of a dilated anisotropic one, after each tool."""
    source = tmp_path / f"{network}.aimet.onnx"
    aimet_export(network, bias=network != "equal-zero-biases", path=source)
    original = variants.imported(source, {})
    path = tmp_path / f"{network}.{tool.replace(' ', '_')}.onnx"
    failure = variants.TOOL_FAILURES.get((f"aimet-torch: {network}", tool))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if failure is not None:
            with pytest.raises(Exception, match=re.escape(failure)):
                variants.TOOLS[tool](source, path)
            return
        variants.TOOLS[tool](source, path)
    check(original, path, tool, {})


def test_the_tools_name_every_known_failure():
    """TOOL_FAILURES names only files and tools of the matrix (a stale entry would hide nothing)."""
    fresh = {f"aimet-torch: {network}" for network in AIMET_NETWORKS}
    assert {name for name, _ in variants.TOOL_FAILURES} <= set(variants.FILES) | fresh
    assert {tool for _, tool in variants.TOOL_FAILURES} <= set(variants.TOOLS)
    assert set(AIMET_NETWORKS) >= {"equal-zero-biases", "anisotropic-dilated"}
