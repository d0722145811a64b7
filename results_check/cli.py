"""The results check's command line: ``python -m results_check [PAGE ...] [--root DIR]`` from the repository root."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import results_check
from results_check.page import ROOT, check_page
from results_check.registry import select


def check(paths: Optional[Sequence[str]] = None, root: str = ROOT) -> Dict[str, List[str]]:
    """Every registered page (or those in ``paths``) → its problems."""
    return {page.path: check_page(page, root) for page in select(paths)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m results_check", description=results_check.__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", help="pages to check (default: every page in results_check.registry.PAGES)")
    parser.add_argument("--root", default=ROOT, help="the repository to check (default: this one)")
    args = parser.parse_args(argv)
    results = check(args.pages or None, args.root)
    failed = 0
    for path, problems in results.items():
        print(f"{path}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
        for problem in problems:
            print(f"  - {problem}")
        failed += bool(problems)
    return 1 if failed else 0
