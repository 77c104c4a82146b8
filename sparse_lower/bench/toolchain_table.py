"""The accelerator-toolchain table of docs/toolchains.md, written from its results file
(docs/toolchains_results.jsonl, a JSON line per measured case, kept by tools/toolchain_table.py, which
measures them): a row per toolchain, model and nna form, each refusal's reason given once as a footnote.
"""

from __future__ import annotations

import re

from .provenance import provenance

def _number(value: float) -> str:
    return f"{value:.1e}" if value < 1e-2 else f"{100 * value:.1f} %"


# What differs between two cases' messages only by accident, and is left out of the table's footnotes: the
# temporary files of a conversion, and the name of the 4-D tensor onnx2tf met first.
_ACCIDENTAL = ((re.compile(r" ERROR: input_onnx_file_path: /tmp/\S+"), ""),
               (re.compile(r"; log: /tmp/[^)\s]+"), ""),
               (re.compile(r"\(4-D '[^']*': "), "(4-D tensors: "))


class Footnotes:
    """The reasons of the table's refusals, each distinct one numbered once, in the order first met."""

    def __init__(self):
        self.reasons: list[str] = []

    def cite(self, why: str) -> str:
        """A cell's reference to `why`: "[n]"."""
        for pattern, replacement in _ACCIDENTAL:
            why = pattern.sub(replacement, why)
        if why not in self.reasons:
            self.reasons.append(why)
        return f"[{self.reasons.index(why) + 1}]"

    def render(self) -> str:
        return "\n".join(f"* [{n}] {why}" for n, why in enumerate(self.reasons, 1))


def _quantized(row: dict, key: str, notes: Footnotes) -> str:
    """A quantized measurement's cell: its max errors (SNR) per measured frame, or why there is none."""
    if key not in row:
        return "not measured"
    if row[key].get("accepted"):
        return ", ".join(f"{_number(e)} ({s:.1f} dB)" for e, s in zip(row[key]["errors"], row[key]["snr_db"]))
    return "no " + notes.cite(row[key].get("why", "(no reason recorded)"))


def toolchains_table(rows: list[dict]) -> str:
    """The Markdown table (and a line per toolchain with its version or why it is missing), then the
    footnotes: every refusal's reason, whole."""
    heads = [r for r in rows if r["model"] == "*"]
    notes = Footnotes()
    lines = ["| toolchain | model | layout | combine | accepted | max error vs onnxruntime | off the accelerator "
             "| compile s | run ms | int8 max error (SNR) | int8 weights, int16 activations |", "|" + "---|" * 11]
    for row in rows:
        if row["model"] == "*":
            continue
        model = row["model"] + (" (capacity per level)" if isinstance(row.get("capacity"), list) else "")
        if not row["accepted"]:
            lines.append(f"| {row['toolchain']} | {model} | {row['layout']} | {row['combine']} | "
                         f"no {notes.cite(row['why'])} | | | | | | |")
            continue
        lines.append(f"| {row['toolchain']} | {model} | {row['layout']} | {row['combine']} | yes | "
                     f"{_number(row['errors'][0])} | {', '.join(row['fallbacks']) or 'none'} | "
                     f"{row['compile_s']:.1f} | {row['run_ms']:.1f} | {_quantized(row, 'int8', notes)} | "
                     f"{_quantized(row, 'w8a16', notes)} |")
    versions = [f"{h['toolchain']} {h['version']} ({h['precision']})" if "version" in h
                else f"{h['toolchain']}: not measured ({h['missing']})" for h in heads]
    where = sorted({provenance(h) if "commit" in h else "an unrecorded machine and commit (measured before the rows "
                    "recorded them, 2026-11-25 to 28)" for h in heads})
    return ("Measured with " + "; ".join(versions) + ", on " + "; ".join(where) + ".\n\n" + "\n".join(lines) + "\n\nWhy a case or a quantized "
            "measurement is missing (\"no [n]\"):\n\n" + notes.render().replace("|", "/"))
