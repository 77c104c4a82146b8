"""What a table of the documentation says of the run it was written from: the machine, the units our
kernels used, the date and the commit."""

from __future__ import annotations

import platform
import re
import subprocess
import time
from pathlib import Path

from ..runtime import vector_units
from ..version import VERSION


def provenance_fields() -> dict:
    """What the documentation's tables say of a run (bench/tables.py): the CPU's model, the units our
    kernels used, the date (UTC) and the commit of the checkout measured (the package's version outside
    one)."""
    info = Path("/proc/cpuinfo")
    models = re.findall(r"^model name\s*:\s*(.+)$", info.read_text(), re.M) if info.is_file() else []
    try:
        commit = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = f"sparse-lower {VERSION}"
    return {"cpu": models[0] if models else platform.processor() or platform.machine(), "vector_units": vector_units(),
            "date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit}


def provenance(result: dict) -> str:
    """Where and when the results were measured, as a caption says it."""
    return (f"{result.get('cpu', result['machine'])}, {result['cores']} cores; our kernels on "
            f"{result.get('vector_units', 'unrecorded units')}; {result.get('date', 'undated')}, commit "
            f"{result.get('commit', 'unrecorded')}")


def captioned(result: dict, table: str) -> str:
    """A markdown table with its caption: the runs' count and `provenance`."""
    return f"Medians of {result['repeat']} runs on {provenance(result)}:\n\n{table}"
