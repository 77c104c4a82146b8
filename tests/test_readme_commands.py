"""Every command and Python example the documentation shows a user, run as written: the README's tour and
Python example, docs/cli.md, docs/portable.md's examples and models/README.md, from a checkout root (a
folder holding `models/`, with the shared data beside it), and models/README.md's commands again from
elsewhere with the path of `models/` spelled out. The README's set-up installs, so it is not run here; its
speed command takes minutes, so the test checks what it would measure instead.

A command that needs an optional extra (a toolchain of `partition --for`, Ray for `run --ray`, a module a
Python example imports) is left out where that extra is not installed, and the test then skips, naming
the command and the `pip install` that brings the extra in; it runs where the extra is installed."""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA
from helpers import sparse_lower_cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TOOLS = ROOT / "tools"

# The Python modules of the optional extras (pyproject.toml) that a documented example may import.
EXTRA_OF_MODULE = {"openvino": "openvino", "tvm": "tvm", "ray": "ray", "torch": "spconv", "spconv": "spconv",
                   "rknn": "rknn", "onnx2tf": "tflite", "ai_edge_litert": "tflite",
                   "onnxruntime_qnn": "qnn"}


@dataclass
class Block:
    """A fenced code block of a document: the `## ` section it is in ("" before the first), its language
    (sh or python) and its text."""

    section: str
    language: str
    text: str


def blocks(document: Path) -> list[Block]:
    """The sh and python blocks of `document`, in order."""
    found, section = [], ""
    for match in re.finditer(r"^## ([^\n]*)$|^```(sh|python)\n(.*?)^```", document.read_text(), flags=re.M | re.S):
        if match.group(1) is not None:
            section = match.group(1).strip()
        else:
            found.append(Block(section, match.group(2), match.group(3)))
    return found


def commands(block: str) -> list[str]:
    """The command lines of a shell block: continuation lines joined, comments and comment lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = (line.split("  #")[0].strip() for line in joined.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def needs(code: str, language: str) -> str | None:
    """Why `code` (a command line, or a Python example) cannot run here: the optional extra it needs and
    how to install it; None when it can run."""
    if language == "sh":
        argv = shlex.split(code)
        if "--for" in argv:
            from sparse_lower.toolchains import toolchain

            return toolchain(argv[argv.index("--for") + 1]).missing()
        modules = ["ray"] if any(a == "--ray" or a.startswith("--ray=") for a in argv) else []
    else:
        modules = re.findall(r"^\s*(?:import|from)\s+(\w+)", code, flags=re.M)
    for module in modules:
        if module in EXTRA_OF_MODULE and importlib.util.find_spec(module) is None:
            extra = EXTRA_OF_MODULE[module]
            return f"the Python module '{module}' is not installed: pip install 'sparse-lower[{extra}]'"
    return None


def execute(code: str, language: str, cwd: Path) -> subprocess.CompletedProcess:
    """One documented command (`sparse-lower …` or `mkdir -p …`) or Python example, run in `cwd`."""
    if language == "python":
        return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600)
    program, *argv = shlex.split(code)
    if program == "mkdir":
        assert argv[0] == "-p", code
        for folder in argv[1:]:
            (cwd / folder).mkdir(parents=True, exist_ok=True)
        return subprocess.CompletedProcess(code, 0, "", "")
    assert program == "sparse-lower", code
    return sparse_lower_cli(*argv, cwd=cwd)


def run_documented(found: list[Block], cwd: Path, run=execute) -> list[str]:
    """Run every command and Python example of `found` in order, in `cwd`, each checked as it runs:
    status 0, a verifying `convert` whose last line is "verify: ok", and a Python example printing what its
    `print(…)  # …` comments say. Returns one line per command left out for a missing extra."""
    left_out = []
    for block in found:
        for code in commands(block.text) if block.language == "sh" else [block.text]:
            reason = needs(code, block.language)
            if reason:
                what = f"`{code}`" if block.language == "sh" else "the Python example"
                left_out.append(f"{what} ({block.section}): {reason}")
                continue
            result = run(code, block.language, cwd)
            assert result.returncode == 0, (code, result.stdout, result.stderr)
            verifying = {"convert"} <= set(code.split()) and not {"--no-verify", "--int8", "--help"} & set(code.split())
            if block.language == "sh" and verifying:
                assert result.stdout.rstrip().splitlines()[-1].startswith("verify: ok"), (code, result.stdout)
            printed = re.findall(r"^print\(.*\)\s+# (.*)$", code, flags=re.M) if block.language == "python" else []
            if printed:
                assert result.stdout.splitlines() == printed, (code, result.stdout, result.stderr)
    return left_out


def skip_if_left_out(left_out: list[str]) -> None:
    if left_out:
        pytest.skip("left out for a missing extra: " + "; ".join(left_out))


def section(document: Path, title: str) -> str:
    return document.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


NOT_RUN = {"Set-up", "Speed"}  # the README's: one installs, one takes minutes (test_the_speed_…)


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A stand-in for the checkout root: `models/` as in the repository, the shared data beside it."""
    if not DATA.is_dir():
        pytest.skip(f"no {DATA}: the examples read the shared data beside the checkout")
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "models").symlink_to(ROOT / "models")
    (tmp_path / "shared").symlink_to(DATA.parent)
    return root


def _frames() -> list[str]:
    return sorted(p.name for p in DATA.glob("*.npz"))


def test_the_readmes_tour_and_python_example_run_as_written(checkout):
    found = [b for b in blocks(README) if b.section not in NOT_RUN]
    assert {b.section for b in found} == {"A five-minute tour", "Python"}, "a README section with commands is not run"
    left_out = run_documented(found, checkout)
    out = checkout / "out"
    assert sorted(p.name for p in (out / "frames").iterdir()) == _frames()
    assert (out / "segments" / "manifest.json").is_file() and (out / "segments" / "picture.png").is_file()
    assert sorted(p.name for p in checkout.iterdir()) == ["models", "out"], "the tour writes only under out/"
    if not left_out:
        assert (out / "openvino" / "01_nna.xml").is_file()
    skip_if_left_out(left_out)


def test_the_command_line_pages_commands_run_as_written(checkout):
    """docs/cli.md: every command, the local run and the Ray run writing the same bytes where Ray is
    installed."""
    left_out = run_documented(blocks(ROOT / "docs" / "cli.md"), checkout)
    out = checkout / "out"
    assert (out / "segments" / "manifest.json").is_file() and (out / "centerpoint_bev.png").is_file()
    assert (out / "passes").is_dir() and sorted(p.name for p in (out / "frames").iterdir()) == _frames()
    assert sorted(p.name for p in checkout.iterdir()) == ["models", "out"], "the commands write only under out/"
    if (out / "frames_ray").is_dir():
        assert sorted(p.name for p in (out / "frames_ray").iterdir()) == _frames()
        for name in _frames():
            with np.load(out / "frames" / name) as a, np.load(out / "frames_ray" / name) as b:
                assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
    skip_if_left_out(left_out)


def test_the_portable_pages_examples_run_as_written(checkout):
    """The portable conversion of the wild NVIDIA file, then the model in plain onnxruntime and, where it is
    installed, in OpenVINO: the BEV shape each prints."""
    found = [b for b in blocks(ROOT / "docs" / "portable.md") if b.section == "Running it"]
    assert [b.language for b in found] == ["sh", "python", "python"]
    skip_if_left_out(run_documented(found, checkout))


def test_the_sample_models_commands_run_as_written(checkout):
    found = blocks(ROOT / "models" / "README.md")
    assert [b.language for b in found] == ["sh", "python"]
    outputs = []
    run_documented(found, checkout, run=lambda *args: outputs.append(execute(*args)) or outputs[-1])
    assert re.fullmatch(r"79,745 voxels in, [\d,]+ rows of 32 channels out\n", outputs[-1].stdout), outputs[-1].stdout
    assert sorted(p.name for p in checkout.iterdir()) == ["models", "out"], "the commands write only under out/"


def test_the_sample_models_commands_run_from_elsewhere(tmp_path):
    (shell, _) = blocks(ROOT / "models" / "README.md")
    elsewhere = Block(shell.section, "sh", shell.text.replace("models/", f"{ROOT / 'models'}/"))
    assert not run_documented([elsewhere], tmp_path)


def test_the_speed_command_measures_the_numbers_it_shows():
    """The README's speed command (minutes long) as the command line parses it: the cases it selects are
    the table's two frames, and the table's numbers are those of the benchmark run kept in
    docs/performance/speed/results.md."""
    from sparse_lower.bench.cases import all_cases, select
    from sparse_lower.cli.bench import BenchCommand

    speed = section(README, "Speed")
    (command,) = commands(re.search(r"```sh\n(.*?)```", speed, flags=re.S).group(1))
    program, subcommand, *argv = shlex.split(command)
    assert (program, subcommand) == ("sparse-lower", "bench"), command
    options = argparse.ArgumentParser(prog="sparse-lower bench", exit_on_error=False)
    BenchCommand.add_arguments(options)
    args = options.parse_args(argv)
    assert args.repeat == 5, command
    cases = [case.name for case in select(all_cases(), args.cases)]
    assert cases == ["centerpoint/centerpoint-frame", "centerpoint/bevfusion-frame"]
    results = (ROOT / "docs" / "performance" / "speed" / "results.md").read_text()
    heads = [h.strip() for h in re.search(r"^\| case \|.*$", results, flags=re.M).group(0).strip("|").split("|")]

    def measured(case: str, system: str) -> str:
        row = re.search(rf"^\| {re.escape(case)} \|.*$", results, flags=re.M).group(0)
        return row.strip("|").split("|")[heads.index(system)].split()[0]

    systems = {"1 thread": "ours-gpu-auto", "2 threads": "ours-gpu-auto-2threads", "spconv": "spconv-2.3.8",
               "MinkowskiEngine": "minkowski-0.5.4"}
    rows = re.findall(r"^\| (.+?) \| ([\d,.]+) \| ([\d,.]+) \|$", speed, flags=re.M)
    assert len(rows) == len(systems), rows
    for (label, *shown), (key, system) in zip(rows, systems.items()):
        assert key in label, (label, key)
        assert shown == [measured(case, system) for case in cases], (label, shown)


def test_the_readme_is_short_and_speaks_of_the_present():
    """A newcomer reads it in minutes: at most 300 lines, no development log (rounds, issues, tries)."""
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    history = re.findall(r"(?i)\bround (?:one|two|three|\d)\b|\bissues?\b(?! tracker)|\bruns? of (?:three|four)\b"
                         r"|\b(?:first|second|third) performance\b", text)
    assert not history, history


def test_the_toolchain_tables_cells_are_whole():
    """docs/toolchains.md's table (rendered from its results file: tests/test_tables.py) gives every
    refusal's message whole in its footnote (none cut at a fixed width)."""
    from sparse_lower.bench.tables import marked_tables, results

    ((name, file, kept),) = marked_tables((ROOT / "docs" / "toolchains.md").read_text())
    assert name == "toolchains"
    for row in results(ROOT / file):
        for why in [row.get("why")] + [row[k].get("why") for k in ("int8", "w8a16") if isinstance(row.get(k), dict)]:
            if why and "/tmp/" not in why and "4-D '" not in why:
                assert why.replace("|", "/") in kept, why


SYSTEM_PYTHON = Path("/usr/bin/python3")  # Debian's own, which refuses `pip install` outside a venv (PEP 668)


def _refuses_pip(python: Path) -> str | None:
    """Why `python` cannot stand for a system Python that refuses pip (None when it can)."""
    if not python.is_file():
        return f"no {python} here"
    done = subprocess.run([str(python), "-c", "import ensurepip, sysconfig; print(sysconfig.get_path('stdlib'))"],
                          capture_output=True, text=True)
    if done.returncode:
        return f"{python} has no venv module (Debian: apt install python3-venv)"
    if not (Path(done.stdout.strip()) / "EXTERNALLY-MANAGED").is_file():
        return f"{python} does not refuse pip (no EXTERNALLY-MANAGED marker)"
    return None


def test_the_setups_first_command_works_where_the_system_python_refuses_pip(tmp_path):
    """The set-up's first command as written, in a copy of the checkout with the shared data beside it, on
    a PATH that holds only the system's programs (Debian 12's Python, which refuses `pip install` outside a
    venv, and no nvcc): it makes its venv, builds the package and runs the demo on the real frame."""
    why = _refuses_pip(SYSTEM_PYTHON)
    if why:
        pytest.skip(why)
    if not DATA.is_dir():
        pytest.skip(f"no {DATA}: the demo reads the shared data beside the checkout")
    (block,) = re.findall(r"```sh\n(.*?)```", section(README, "Set-up"), flags=re.S)
    first, _ = commands(block)
    checkout = tmp_path / "checkout"
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, text=True, check=True)  # the working tree, as git would commit it
    for name in filter(None, tracked.stdout.split("\0")):
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            (checkout / name).write_bytes((ROOT / name).read_bytes())
    (tmp_path / "shared").symlink_to(DATA.parent)
    refused = subprocess.run(["bash", "-c", "python3 -m pip install --dry-run --no-deps ."], cwd=checkout,
                             env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}, capture_output=True, text=True)
    assert refused.returncode != 0  # what the set-up has to get around
    done = subprocess.run(["bash", "-c", first], cwd=checkout, env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "nuscenes_centerpoint_voxels.npz: 79,745 voxels" in done.stdout, done.stdout[-3000:]
    assert (checkout / "centerpoint_bev.png").is_file() and (checkout / ".venv" / "bin" / "sparse-lower").is_file()


def test_the_setups_extras_command_compiles_nothing():
    """The set-up's second command adds the extras to the package the first one installed. pip's dry run
    (`--no-deps`: offline) must install nothing of sparse-lower itself: rebuilding it compiles the custom-op
    library again, minutes for each extra, as a checkout's `pip install ".[EXTRA]"` always does."""
    from importlib import metadata

    try:
        metadata.distribution("sparse-lower")
    except metadata.PackageNotFoundError:
        pytest.skip("sparse-lower is not installed here (the set-up's first command installs it)")
    (block,) = re.findall(r"```sh\n(.*?)```", section(README, "Set-up"), flags=re.S)
    _, second = commands(block)
    (extras,) = [word for part in second.split("&&") for word in shlex.split(part)[2:]
                 if shlex.split(part)[:2] == ["pip", "install"] and "[" in word]
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--quiet", "--report", "-",
                           extras], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    assert [item["metadata"]["name"] for item in json.loads(done.stdout)["install"]] == [], extras


def test_a_command_whose_extra_is_missing_is_left_out_and_the_test_says_why(monkeypatch, tmp_path):
    """The README's `partition --for openvino`, Ray's `run --ray` and OpenVINO's Python example, with each
    extra reported missing, then present: left out with the reason and the install, then run."""
    tour = [b for b in blocks(README) if b.section == "A five-minute tour"]
    on_openvino = [c for b in tour for c in commands(b.text) if "--for openvino" in c]
    assert on_openvino, "the tour deploys to OpenVINO"
    on_ray = Block("Running many frames", "sh", "sparse-lower run m.onnx frames/ -o out/ --ray --workers 2\n")
    in_python = Block("Running it", "python", "import numpy as np\nimport openvino as ov\n")
    ran = []

    def record(code, language, cwd):
        ran.append(code)
        return subprocess.CompletedProcess(code, 0, "verify: ok\n", "")

    for module in ("openvino", "ray"):
        monkeypatch.setitem(sys.modules, module, None)  # what importlib reports for a module not installed
    left_out = run_documented([*tour, on_ray, in_python], tmp_path, run=record)
    assert left_out == [
        f"`{on_openvino[0]}` (A five-minute tour): OpenVINO is not installed (Python module 'openvino'): "
        f"pip install 'sparse-lower[openvino]'",
        "`sparse-lower run m.onnx frames/ -o out/ --ray --workers 2` (Running many frames): the Python module "
        "'ray' is not installed: pip install 'sparse-lower[ray]'",
        "the Python example (Running it): the Python module 'openvino' is not installed: "
        "pip install 'sparse-lower[openvino]'"]
    assert ran == [c for b in tour for c in commands(b.text) if c not in on_openvino]
    with pytest.raises(pytest.skip.Exception, match=r"left out for a missing extra: .*--for openvino"):
        skip_if_left_out(left_out)

    for module in ("openvino", "ray"):  # installed: a module with a spec
        monkeypatch.setitem(sys.modules, module, importlib.util.module_from_spec(
            importlib.machinery.ModuleSpec(module, None)))
    ran.clear()
    assert run_documented([*tour, on_ray, in_python], tmp_path, run=record) == []
    assert on_openvino[0] in ran and on_ray.text.strip() in ran and in_python.text in ran
