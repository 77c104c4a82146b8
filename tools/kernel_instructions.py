"""Instructions per multiply-add in the inner loops of the aarch64 row GEMMs, counted from the
disassembly of the cross-built library: emulation runs the NEON paths (tests/test_aarch64.py) but says
nothing of their speed on an ARM core, so this is what can be measured here. Writes results.json and
results.md into --out; docs/performance/aarch64.md renders its table from them (tools/render_tables.py).

    bash tools/aarch64.sh build
    python tools/kernel_instructions.py --out docs/performance/aarch64

Each kernel's inner loop is the innermost loop (a backward branch with no other inside it) of its
function holding the most multiply-adds; a multiply-add instruction counts the products it forms
(FMLA on 4 floats: 4; SDOT: 4 lanes × 4 bytes = 16; USMMLA: 2 × 2 × 8 = 32).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from sparse_lower.bench.tables import kernel_instructions_table  # noqa: E402

# path -> (the function whose inner loop is counted, the products per multiply-add instruction)
KERNELS = {"neon: float, FMLA by element": ("sparse_lower::NeonRows(", {"fmla": 4}),
           "neon-dotprod: int8, SDOT by element": ("sparse_lower::(anonymous namespace)::DotRows<6>(", {"sdot": 16}),
           "neon-i8mm: int8, USMMLA": ("sparse_lower::(anonymous namespace)::MmlaRows<6>(", {"usmmla": 32})}
BRANCHES = re.compile(r"^(b|b\..+|cbz|cbnz|tbz|tbnz)$")


def functions(disassembly: str) -> dict[str, list[tuple[int, str]]]:
    """Function name -> its (address, mnemonic) in order, from `objdump -d -C --no-show-raw-insn`."""
    found, name = {}, None
    for line in disassembly.splitlines():
        if header := re.match(r"^[0-9a-f]+ <(.*)>:$", line):
            name = header[1]
            found[name] = []
        elif (instruction := re.match(r"^\s+([0-9a-f]+):\s+(\S+)\s*(.*)$", line)) and name is not None:
            target = re.search(r"\b([0-9a-f]+) <", instruction[3])
            found[name].append((int(instruction[1], 16), instruction[2], int(target[1], 16) if target else None))
    return found


def inner_loops(instructions: list) -> list[list[str]]:
    """The mnemonics of each innermost loop: from a backward branch's target to the branch, no other
    such loop inside."""
    spans = [(target, address) for address, mnemonic, target in instructions
             if BRANCHES.match(mnemonic) and target is not None and target <= address]
    innermost = [(start, end) for start, end in spans
                 if not any((s, e) != (start, end) and start <= s and e <= end for s, e in spans)]
    return [[mnemonic for address, mnemonic, _ in instructions if start <= address <= end] for start, end in innermost]


def count(library: Path) -> dict:
    """Each kernel's inner loop: its instructions by mnemonic, its multiply-adds and their ratio."""
    disassembly = subprocess.run(["aarch64-linux-gnu-objdump", "-d", "-C", "--no-show-raw-insn", str(library)],
                                 capture_output=True, text=True, check=True).stdout
    table = functions(disassembly)
    kernels = {}
    for path, (prefix, products) in KERNELS.items():
        (body,) = [instructions for name, instructions in table.items() if prefix in name]
        loop = max(inner_loops(body), key=lambda mnemonics: sum(products.get(m, 0) for m in mnemonics))
        macs = sum(products.get(m, 0) for m in loop)
        kernels[path] = {"function": prefix.rstrip("("), "instructions": len(loop), "multiply_adds": macs,
                         "multiply_add_instructions": sum(m in products for m in loop),
                         "loads": sum(m.startswith("ld") for m in loop),
                         "stores": sum(m.startswith("st") for m in loop),
                         "by_mnemonic": dict(collections.Counter(loop).most_common())}
    return kernels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", type=Path, default=ROOT / "build" / "aarch64" / "lib" / "libsparse_lower_ops.so")
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json and results.md")
    args = parser.parse_args()
    compiler = subprocess.run(["aarch64-linux-gnu-g++", "--version"], capture_output=True, text=True,
                              check=True).stdout.splitlines()[0]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    result = {"compiler": compiler, "date": time.strftime("%Y-%m-%d", time.gmtime()), "commit": commit,
              "kernels": count(args.library)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "results.md").write_text(kernel_instructions_table(result) + "\n")
    print(kernel_instructions_table(result))


if __name__ == "__main__":
    main()
