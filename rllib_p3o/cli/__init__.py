"""``rllib-p3o`` console command: the everyday jobs.

    rllib-p3o train CONFIG.yaml [--set SECTION.KEY=VALUE ...] [--resume]     `rllib_p3o.cli.train`
    rllib-p3o export CHECKPOINT OUT [--merged]                              `rllib_p3o.cli.export`
    rllib-p3o validate PATH... [--kind prompts|trajectories] [--model DIR] [--reward-fn module:function]
                                                                            `rllib_p3o.cli.validate`
    rllib-p3o sweep [--quick | --full] [--out DIR] ...                      (`rllib_p3o.sweep.run`: its own --help)

Exit status: 0 when the job did what was asked; 1 when it ran but failed (a trial errored or missed its target,
the data has problems); 2 on usage errors (a bad option or config file).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional

USAGE_ERROR = 2


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    import_from_working_directory()
    if argv[:1] == ["sweep"]:
        from rllib_p3o.sweep.run import main as sweep_main

        return sweep_main(argv[1:])
    from rllib_p3o.cli import export, train, validate

    parser = argparse.ArgumentParser(prog="rllib-p3o", description="rllib-p3o tools")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {module.NAME: module for module in (train, export, validate)}
    for module in commands.values():
        module.add_parser(sub)
    sub.add_parser("sweep", add_help=False, help="method × regime × seed comparison as Tune experiments (--help)")
    args = parser.parse_args(argv)
    return commands[args.command].run(args)


def import_from_working_directory() -> None:
    """Put the working directory first on ``sys.path``, as ``python script.py`` and ``python -m`` do: a config's
    ``"my_rewards:accuracy"`` is then imported from the folder the command runs in (a console script's own
    ``sys.path[0]`` is its ``bin/`` folder). `rllib_p3o.cli.train` ships such modules to Ray's workers."""
    here = os.getcwd()
    if not any(os.path.abspath(entry or os.curdir) == here for entry in sys.path):
        sys.path.insert(0, here)


if __name__ == "__main__":
    sys.exit(main())
