"""The results pages the results check covers: one `Page` per page, each from a module of `results_check/pages/`
that derives the page's text from its committed result files. Adding a page is one module there and one entry here."""

from __future__ import annotations

from typing import List, Optional, Sequence

from results_check.page import Page
from results_check.pages import (
    addition,
    benchmarks_page,
    busy_machine,
    claims,
    claims_sweep,
    demo,
    faults,
    inflight,
    precision,
    provenance,
    readme,
    soak,
    staleness,
    tool_use,
)

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
    busy_machine.PAGE,
    staleness.PAGE,
    provenance.PAGE,
    inflight.PAGE,
    addition.PAGE,
]


def select(paths: Optional[Sequence[str]] = None) -> List[Page]:
    """The registered pages whose paths are in ``paths`` (every page when None); an unregistered path is an error."""
    selected = [p for p in PAGES if paths is None or p.path in paths]
    if paths is not None and len(selected) != len(paths):
        raise ValueError(
            f"not registered in results_check.registry.PAGES: {sorted(set(paths) - {p.path for p in selected})}"
        )
    return selected
