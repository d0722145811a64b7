"""The results check: every results page against the committed files it reports.

    python -m results_check [PAGE ...]     # from the repository root; exit 1 and a list of problems when a page
                                           # disagrees (default: every registered page)

A page is registered in `results_check.registry.PAGES` (one entry per page, one module per page in
`results_check/pages/`) with a function that reads its result files and returns the page's *quotes*: the text the
page must contain, numbers included, written from the data (table rows, the figures its sentences quote, each claim
word from `rllib_p3o.sweep.verdicts`). The check finds each quote on the page (whitespace and line breaks do not
count), then requires every other number of the page's prose to be covered by a quote or by one of the page's
declared *settings* (phrases that give the setup, "64 prompts × 8 completions", not a result). So a number changed on
the page, or in a result file, fails it, and so does a number nobody derives.

Not counted as prose: fenced code, inline code, link targets, HTML comments and the page's "How this was measured"
box (which must name the command, the version and the machine, and no commit hash). A section whose figures have no
committed file is declared `unchecked` with the reason, and must say so on the page with `UNCHECKED_NOTE`.

The modules, each importing only those listed before it: `page` (`Page` and the matching), `pages/` (the page
modules), `registry` (the list of pages), `cli` (the command line; `__main__` runs it). Beside them, `commands`
(the commands a page quotes) and `argv_probe` (a command line parsed by its script's own parser), which
`tests/test_results_commands.py` uses.
"""
