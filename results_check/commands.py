"""The commands a results page quotes, with the result files it cites for each: what
`tests/test_results_commands.py` runs through each script's own parser (`results_check.argv_probe`)."""

from __future__ import annotations

import dataclasses
import re
import shlex
from typing import List

from results_check.page import _FENCE, _INLINE_CODE, normalize


@dataclasses.dataclass(frozen=True)
class Command:
    """A command a page quotes: the script it runs (relative to the repository), its arguments, the result files the
    page cites for it (in the command's own ``--out``-style flags or after it, before the next command, in the same
    paragraph) and whether the paragraph says its output is "copied to" a committed folder."""

    line: str
    script: str
    argv: List[str]
    cited: List[str]
    copied_to: List[str]


_COMMAND = re.compile(
    r"^(?:python (?P<script>(?:benchmarks|examples)/[\w/]+\.py)|python -m (?P<module>rllib_p3o(?:\.\w+)+)"
    r"|rllib-p3o (?P<sub>sweep))(?:\s|$)"
)
# A committed result: a file or folder under the folders that hold them.
_RESULT_PATH = re.compile(r"^(?:docs|results)/(?:[\w.-]+/)*(?:[\w.-]+\.(?:json|png|csv|md))?$")
SUBCOMMANDS = {"sweep": "rllib_p3o/sweep/run.py"}


def page_commands(text: str) -> List[Command]:
    """The commands a page quotes (inline code that starts ``python benchmarks/``, ``python examples/``,
    ``python -m rllib_p3o.…`` or ``rllib-p3o sweep``), each with the result paths cited for it."""
    commands: List[Command] = []
    for block in re.split(r"\n\s*\n", _FENCE.sub("", text)):
        spans = [normalize(m.group(0)[1:-1]) for m in _INLINE_CODE.finditer(block)]
        copied = re.findall(r"(?:copied to|files are in) `([^`]+)`", normalize(block))
        for i, span_text in enumerate(spans):
            match = _COMMAND.match(span_text)
            if not match:
                continue
            module = match.group("module")
            argv = shlex.split(span_text)[3 if module else 2 :]
            if module:  # `python -m rllib_p3o.sweep.compare`: the module's file
                script = module.replace(".", "/") + ".py"
            else:
                script = match.group("script") or SUBCOMMANDS[match.group("sub")]
            cited = [arg for arg in argv if _RESULT_PATH.match(arg)]
            for later in spans[i + 1 :]:
                if _COMMAND.match(later):
                    break
                if _RESULT_PATH.match(later):
                    cited.append(later)
            commands.append(Command(span_text, script, argv, cited, copied))
    return commands
