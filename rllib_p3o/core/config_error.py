"""The error of a mistake in a config or in what it names (a setting, a file, a model, the cluster's size).

Its message says which setting, what is wrong and how to fix it, so that a person needs nothing else: when one ends a
script it is shown as that one line, without the traceback through Tune's or RLlib's internals that leads to where it
was found (`rllib_p3o.driver.one_line_errors`). A `ValueError`, as configuration errors are in RLlib.
"""

import difflib
from typing import Iterable


class ConfigError(ValueError):
    """A mistake in the config or in what it names; the message names the setting, the problem and the fix."""


class UnknownSettingError(ConfigError, TypeError):
    """A keyword that ``P3OConfig.training()`` does not take, with the ones it is nearest to. A `TypeError`, as
    Python's own for an unexpected keyword argument (and RLlib's ``training``), and a `ConfigError`, so that it ends
    a script as its one line."""


def unknown_keyword_message(method: str, keyword: str, known: Iterable[str]) -> str:
    """Python's message for an unexpected keyword argument of ``P3OConfig.<method>()``, with the known keywords
    nearest to it (difflib)."""
    near = difflib.get_close_matches(keyword, sorted(known), n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(repr(k) for k in near)}?)" if near else ""
    return (
        f"P3OConfig.{method}() got an unexpected keyword argument {keyword!r}{hint}; its keywords: the configuration "
        "reference (docs/reference/configuration.md) and help(P3OConfig.training)"
    )
