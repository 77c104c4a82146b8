"""Every command the README's command-line section and models/README.md show, run as written: from a
checkout root (a folder holding `models/`, with the shared data beside it), and the sample commands
again from elsewhere with the path of `models/` spelled out."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import DATA
from helpers import sparse_lower_cli

ROOT = Path(__file__).resolve().parents[1]


def blocks(readme: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", readme.read_text(), flags=re.S)


def commands(block: str) -> list[str]:
    """The command lines of a shell block, comments dropped."""
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    program, *argv = shlex.split(command)
    assert program == "sparse-lower", command
    return sparse_lower_cli(*argv, cwd=cwd)


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


def test_the_sample_models_commands_run_as_written(checkout):
    readme = ROOT / "models" / "README.md"
    (shell,) = blocks(readme, "sh")
    for command in commands(shell):
        result = run(command, checkout)
        assert result.returncode == 0, (command, result.stdout, result.stderr)
        if " convert " in f" {command} ":
            assert result.stdout.rstrip().endswith("verify: ok"), (command, result.stdout)
    (python,) = blocks(readme, "python")
    result = subprocess.run([sys.executable, "-c", python], cwd=checkout, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"79,745 voxels in, [\d,]+ rows of 32 channels out\n", result.stdout), result.stdout


def test_the_sample_models_commands_run_from_elsewhere(tmp_path):
    (shell,) = blocks(ROOT / "models" / "README.md", "sh")
    for command in commands(shell):
        result = run(command.replace("models/", f"{ROOT / 'models'}/"), tmp_path)
        assert result.returncode == 0, (command, result.stdout, result.stderr)


def test_the_readmes_command_line_section_runs_as_written(checkout):
    section = ROOT.joinpath("README.md").read_text().split("## Command line", 1)[1].split("\n## ", 1)[0]
    (shell,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    for command in commands(shell):
        result = run(command, checkout)
        assert result.returncode == 0, (command, result.stdout, result.stderr)
    assert (checkout / "segments" / "manifest.json").is_file() and (checkout / "centerpoint_bev.png").is_file()


def test_the_readmes_running_many_frames_section_runs_as_written(checkout):
    """The local command, and the Ray one where Ray is installed; both write every shared frame, and the
    same bytes."""
    section = ROOT.joinpath("README.md").read_text().split("## Running many frames", 1)[1].split("\n## ", 1)[0]
    (shell,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    local, on_ray = commands(shell)
    result = run(local, checkout)
    assert result.returncode == 0 and ", 0 failed," in result.stdout, (local, result.stdout, result.stderr)
    try:
        import ray  # noqa: F401
    except ImportError as error:
        pytest.skip(f"the Ray command needs ray ({error}): pip install '.[ray]'")
    result = run(on_ray, checkout)
    assert result.returncode == 0 and ", 0 failed," in result.stdout, (on_ray, result.stdout, result.stderr)
    frames = sorted(p.name for p in DATA.glob("*.npz"))
    for name in frames:
        with np.load(checkout / "outputs" / name) as a, np.load(checkout / "outputs_ray" / name) as b:
            assert a.files == b.files and all(np.array_equal(a[k], b[k]) for k in a.files)
    assert sorted(p.name for p in (checkout / "outputs_ray").iterdir()) == frames


def test_the_readmes_runs_anywhere_section_runs_as_written(checkout):
    """The portable conversion of the wild NVIDIA file, then the model in plain onnxruntime and, where it is
    installed, in OpenVINO: the BEV shape each prints."""
    section = ROOT.joinpath("README.md").read_text().split("## Runs anywhere", 1)[1].split("\n## ", 1)[0]
    (shell,) = re.findall(r"```sh\n(.*?)```", section, flags=re.S)
    for command in commands(shell):
        result = run(command, checkout)
        assert result.returncode == 0 and "verify: ok" in result.stdout, (command, result.stdout, result.stderr)
    on_onnxruntime, on_openvino = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    scripts = [on_onnxruntime]
    try:
        import openvino  # noqa: F401
        scripts.append(on_openvino)
    except ImportError:
        pass
    for script in scripts:
        result = subprocess.run([sys.executable, "-c", script], cwd=checkout, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0 and result.stdout == "(1, 256, 180, 180)\n", (result.stdout, result.stderr)
    if len(scripts) == 1:
        pytest.skip("OpenVINO is not installed: pip install '.[openvino]' runs its example too")
