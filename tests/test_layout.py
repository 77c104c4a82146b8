"""docs/layout.md matches the tree: every path it names exists, and every part a newcomer
looks for is named there — each package and top-level module, each pass, lowering rule, compute form,
importer (format), device table and toolchain, each command, each tool, and each custom op with the
file that holds its kernel. A file added or moved without the layout being updated fails here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESCRIPTION_COLUMN = 25  # a line indented this far continues the description above it


LAYOUT = ROOT / "docs" / "layout.md"


def layout_block() -> str:
    return re.search(r"^```\n(.*?)^```", LAYOUT.read_text(), flags=re.S | re.M).group(1)


def named_paths() -> list[str]:
    """The paths of the layout, relative to the repository root. An entry's indentation (two spaces a
    level) puts it inside the last folder above it; one entry may name several paths ("a.py, b.py")."""
    folders: list[str] = []
    paths = []
    for line in layout_block().splitlines():
        indent = len(line) - len(line.lstrip())
        if not line.strip() or indent >= DESCRIPTION_COLUMN:
            continue
        level = indent // 2
        names = re.split(r" {2,}", line.strip())[0]
        folders = folders[:level]
        for name in (n.strip() for n in names.split(",")):
            paths.append("".join(folders) + name)
        if names.endswith("/") and "," not in names:
            folders.append(names)
    return paths


NAMED = named_paths()


def test_the_layout_names_only_what_exists():
    missing = [path for path in NAMED if not (ROOT / path).exists()]
    assert not missing, f"docs/layout.md names paths that do not exist: {missing}"


def _required() -> list[str]:
    """What the layout must name: each package (at any depth) and top-level module of sparse_lower/,
    every module of the packages a reader looks things up in, each tool and each custom-op folder."""
    package = ROOT / "sparse_lower"
    required = ["pyproject.toml", "CMakeLists.txt", "custom_ops/", "docs/", "models/", "sparse_lower/", "tests/", "tools/"]
    required += [f"{p.relative_to(ROOT)}/" for p in sorted(package.rglob("*")) if p.is_dir()
                and (p / "__init__.py").is_file()]
    required += [str(p.relative_to(ROOT)) for p in sorted(package.glob("*.py")) if p.name != "__init__.py"]
    for folder in ("passes", "lowering", "lowering/rules", "lowering/gpu", "lowering/nna", "lowering/portable", "importers", "partition",
                   "toolchains", "cli", "frames"):
        required += [str(p.relative_to(ROOT)) for p in sorted((package / folder).glob("*.py"))
                     if p.name != "__init__.py"]
    required += [str(p.relative_to(ROOT)) for p in sorted((ROOT / "tools").iterdir()) if p.is_file()]
    required += [f"{p.relative_to(ROOT)}/" for p in sorted((ROOT / "custom_ops").iterdir()) if p.is_dir()]
    return required


@pytest.mark.parametrize("path", _required())
def test_the_layout_names_every_part(path):
    named = {p.rstrip("/") for p in NAMED}
    assert path.rstrip("/") in named, f"add {path} to docs/layout.md"


def _registered_ops() -> list[str]:
    return re.findall(r"static const Op<(\w+)>", ROOT.joinpath("custom_ops/register.cc").read_text())


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


@pytest.mark.parametrize("op", _registered_ops())
def test_each_custom_op_is_in_a_file_named_after_it_and_named_in_the_layout(op):
    headers = list(ROOT.joinpath("custom_ops").glob(f"*/{_snake(op)}.h"))
    assert len(headers) == 1, f"{op}: expected one custom_ops/<family>/{_snake(op)}.h, found {headers}"
    assert re.search(rf"\b{op}\b", layout_block()), f"name {op} in docs/layout.md"


def test_each_tool_has_its_line_in_the_tools_readme():
    """tools/README.md says what every script of tools/ is for (nothing there is unreachable)."""
    tools = Path(__file__).resolve().parents[1] / "tools"
    named = set(re.findall(r"^\| `([^`]+)` \|", (tools / "README.md").read_text(), re.M))
    present = {p.name for p in tools.iterdir() if p.name != "README.md" and p.name != "__pycache__"}
    present = {f"{name}/" if (tools / name).is_dir() else name for name in present}
    assert named == present
