"""Long steps say what runs (issue 71): a step still running after LONG_STEP_S prints its start on a log or a
pipe, every step its time when it ends, on stderr, nothing under -q; `partition` and `bench` say each step."""

from __future__ import annotations

import io
import time

import onnx

import sparse_lower
from helpers import sparse_lower_cli
from sparse_lower.cli import status
from sparse_lower.models import centerpoint_head_stack


def test_a_long_step_says_it_started_and_a_short_one_only_its_time(monkeypatch):
    monkeypatch.setattr(status, "LONG_STEP_S", 0.1)
    stream = io.StringIO()
    said = status.Status(stream=stream)
    with said.step("short"):
        pass
    with said.step("long"):
        time.sleep(0.4)
    assert stream.getvalue().splitlines()[0].startswith("short: ")
    assert stream.getvalue().splitlines()[1:3] == ["long …", stream.getvalue().splitlines()[2]]
    assert stream.getvalue().splitlines()[2].startswith("long: 0.")
    quiet = io.StringIO()
    with status.Status(quiet=True, stream=quiet).step("long"):
        time.sleep(0.3)
    assert quiet.getvalue() == ""


def test_partition_says_its_steps_on_stderr_unless_quiet(tmp_path):
    onnx.save(sparse_lower.lower(centerpoint_head_stack(), target="nna", max_active=1000), tmp_path / "head.onnx")
    said = sparse_lower_cli("partition", "head.onnx", "--out-dir", "parts", cwd=tmp_path)
    assert said.returncode == 0, said.stderr
    assert "partitioning: " in said.stderr
    quiet = sparse_lower_cli("partition", "head.onnx", "--out-dir", "parts2", "-q", cwd=tmp_path)
    assert quiet.returncode == 0 and "partitioning" not in quiet.stderr
