"""The page modules of the results check: one module per results page, each deriving the page's text from its
committed result files (its `PAGE`, registered in `results_check/registry.py`), and the helpers they share
(`_fmt`: numbers and table rows as the pages print them; `_paths`: where the result files live; `_code`: settings
read from the source)."""
