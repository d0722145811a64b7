"""The error of a mistake in a config or in what it names (a setting, a file, a model, the cluster's size).

Its message says which setting, what is wrong and how to fix it, so that a person needs nothing else: when one ends a
script it is shown as that one line, without the traceback through Tune's or RLlib's internals that leads to where it
was found (`rllib_p3o.driver.one_line_errors`). A `ValueError`, as configuration errors are in RLlib.
"""


class ConfigError(ValueError):
    """A mistake in the config or in what it names; the message names the setting, the problem and the fix."""
