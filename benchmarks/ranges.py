"""Several runs of one benchmark's Markdown into one, each figure with its run-to-run range.

The benchmarks print Markdown. Run k times, their outputs have the same lines with different
numbers; this puts the runs side by side line by line and writes each number that moved as
``median (lowest–highest)``, keeping the decimals and thousands separators the benchmark chose.
Numbers that did not move (client counts, settings) stay as they are. Dates and times are
not figures: the first run's stand. Lines that do not match across the runs (a row only one
run printed) are kept from the first run, and the differing runs are shown after it in full.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence

# A number on its own, not the digits of a name such as p50 or a version such as 3.11.7.
NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?(?![\w.]*\d)")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2})?(?: UTC)?)?")


def skeleton(line: str) -> str:
    return NUMBER.sub("#", DATE.sub("@", line))


def _value(text: str) -> float:
    return float(text.replace(",", ""))


def _format(value: float, like: Sequence[str]) -> str:
    decimals = max((len(t.split(".")[1]) if "." in t else 0) for t in like)
    grouped = any("," in t for t in like)
    return f"{value:{',' if grouped else ''}.{decimals}f}"


def merge_line(lines: Sequence[str]) -> str:
    """One line out of the runs' same line: each number that moved becomes its range."""
    first = lines[0]
    dates = DATE.findall(first)
    columns = [NUMBER.findall(DATE.sub("@", line)) for line in lines]
    pieces = NUMBER.split(DATE.sub("@", first))
    out = [pieces[0]]
    for i, rest in enumerate(pieces[1:]):
        texts = [column[i] for column in columns]
        if len(set(texts)) == 1:
            out.append(texts[0])
        else:
            # a ratio's or share's sign goes with each number: "1.2x (1.1x–1.4x)"
            unit = rest[0] if rest[:1] in ("x", "%") else ""
            rest = rest[len(unit):]
            values = [_value(t) for t in texts]
            low, middle, high = (_format(v, texts) + unit
                                 for v in (min(values), statistics.median(values), max(values)))
            out.append(f"{middle} ({low}–{high})")
        out.append(rest)
    merged = "".join(out)
    for date in dates:
        merged = merged.replace("@", date, 1)
    return merged


def merge(outputs: Sequence[str]) -> str:
    """The runs' outputs as one, with ranges; one output comes back as it was."""
    if len(outputs) == 1:
        return outputs[0].rstrip("\n")
    runs = [output.rstrip("\n").splitlines() for output in outputs]
    shapes = [[skeleton(line) for line in run] for run in runs]
    merged, odd = [], []
    for k, shape in enumerate(shapes[1:], start=1):
        if shape != shapes[0]:
            odd.append(k)
    same = [run for k, run in enumerate(runs) if k not in odd]
    for i in range(len(runs[0])):
        merged.append(merge_line([run[i] for run in same]))
    for k in odd:
        merged += ["", f"Run {k + 1} printed other lines than run 1; it is shown whole:", "",
                   *runs[k]]
    return "\n".join(merged)
