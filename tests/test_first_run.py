"""What a new user meets in the first hour, as they meet it: each case reproduces a report of the
first-run issue."""

from __future__ import annotations

import shutil
from importlib import metadata
from pathlib import Path

import pytest

import sparse_lower
from sparse_lower import runtime
from sparse_lower.models import centerpoint_head_stack

PACKAGE = Path(sparse_lower.__file__).parent


def _source_tree(tmp_path: Path) -> Path:
    """A checkout: the package's sources (no build), pyproject.toml and custom_ops/."""
    checkout = tmp_path / "checkout"
    shutil.copytree(PACKAGE, checkout / "sparse_lower", ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (checkout / "pyproject.toml").write_text("[project]\nname = 'sparse-lower'\n")
    (checkout / "custom_ops").mkdir()
    return checkout


def test_the_source_tree_shadowing_the_installed_package_uses_the_installed_library(tmp_path, monkeypatch):
    """Python run from a checkout root after `pip install .` imports the sources (the package's only
    folder is the checkout's), which hold no library: the installed one is used, as the user expects."""
    checkout = _source_tree(tmp_path)
    monkeypatch.delenv(runtime.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(sparse_lower, "__path__", [str(checkout / "sparse_lower")])
    installed = Path(metadata.distribution("sparse-lower").locate_file(f"sparse_lower/{runtime.LIBRARY_NAME}"))
    assert Path(runtime.get_library_path()) == installed
    model = sparse_lower.lower(centerpoint_head_stack(), target="gpu")
    assert sparse_lower.create_session(model).get_outputs()


def test_a_source_tree_with_nothing_installed_says_which_package_python_reads(tmp_path, monkeypatch):
    checkout = _source_tree(tmp_path)
    monkeypatch.delenv(runtime.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(sparse_lower, "__path__", [str(checkout / "sparse_lower")])
    monkeypatch.setattr(runtime, "_installed_library", lambda: None)  # no sparse-lower installed
    with pytest.raises(FileNotFoundError) as raised:
        runtime.get_library_path()
    message = str(raised.value)
    assert f"sparse_lower was imported from its source tree {checkout / 'sparse_lower'}" in message, message
    assert f"install the checkout with `pip install {checkout}`" in message


def test_an_installed_package_without_its_library_says_how_to_build_it(tmp_path, monkeypatch):
    monkeypatch.delenv(runtime.LIBRARY_ENV, raising=False)
    monkeypatch.setattr(sparse_lower, "__path__", [str(tmp_path)])
    monkeypatch.setattr(runtime, "_installed_library", lambda: None)
    with pytest.raises(FileNotFoundError, match="the sparse_lower custom-op library is not built: no "
                                                "libsparse_lower_ops.so in"):
        runtime.get_library_path()
