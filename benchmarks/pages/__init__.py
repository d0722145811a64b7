"""The results pages the results check covers (`benchmarks/results_check.py`): one `Page` per page, each in a module
of its own that derives the page's text from its committed result files. Adding a page is one entry here."""

from __future__ import annotations

from typing import List

from results_check import Page

from pages import benchmarks_page, claims, claims_sweep, demo, faults, precision, readme, soak, tool_use

PAGES: List[Page] = [
    claims.PAGE,
    claims_sweep.PAGE,
    soak.PAGE,
    precision.PAGE,
    benchmarks_page.PAGE,
    readme.PAGE,
    demo.PAGE,
    tool_use.PAGE,
    faults.PAGE,
]
