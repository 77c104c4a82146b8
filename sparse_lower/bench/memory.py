"""Peak resident memory of one system running one case, measured in a fresh process.

Peak RSS is a high-water mark per process, so systems that share the timing process cannot be told
apart; each measurement therefore runs `main(CASE, SYSTEM)` in a child process (importing this very
package, whatever the working directory holds) that builds the case, prepares the system (lowering,
session, warm-up run) and runs it once more. The peak includes the interpreter, the libraries the system imports (torch for spconv) and
the case's own data, which is what a deployment pays.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from ..frames.sample import find_data
from .cases import all_cases, scaling_cases
from .systems import default_systems


def peak_rss_mb(case_name: str, system_name: str, quick: bool = False) -> float | str:
    """The child's peak RSS in MiB, or why there is none."""
    command = [sys.executable, "-c", f"from {__name__} import main; raise SystemExit(main())", case_name,
               system_name] + (["--quick"] if quick else [])
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    data = find_data()  # found from this process's cwd; the child runs elsewhere
    if data is not None:
        env["SPARSE_LOWER_DATA"] = str(data.resolve().parent)
    child = subprocess.run(command, capture_output=True, text=True, check=False, cwd=tempfile.gettempdir(), env=env)
    if child.returncode != 0:
        return "failed: " + (child.stderr.strip().splitlines() or ["no output"])[-1]
    return json.loads(child.stdout.strip().splitlines()[-1])["peak_rss_mb"]


def process_peak_mb() -> float:
    """This process's resident high-water mark. VmHWM where Linux has it: ru_maxrss also counts the
    parent's memory from before the exec (the child starts as a fork of the benchmark process)."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None) -> int:
    case_name, system_name, *rest = argv if argv is not None else sys.argv[1:]
    (case,) = [c for c in all_cases(quick="--quick" in rest) + scaling_cases() if c.name == case_name]
    (system,) = [s for s in default_systems(None) if s.name == system_name]
    prepared = system.prepare(case.build())
    prepared.run()
    print(json.dumps({"peak_rss_mb": round(process_peak_mb(), 1)}))
    return 0
