"""Generated from the settings' declarations (`rllib_p3o.core.settings`): the configuration reference's tables
(docs/reference/configuration.md, between its markers) and the signature of ``P3OConfig.training``
(`rllib_p3o.driver.training_signature`, the whole module), so that ``help(P3OConfig.training)`` and an IDE list
every setting with its type and default.

    python -m devtools.reference            # exit 1, naming the stale file, when either is out of date
    python -m devtools.reference --write    # rewrite both (`make reference`)
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import textwrap
from typing import List, Optional, Sequence

from rllib_p3o.core.losses import LOSSES
from rllib_p3o.core.settings import GROUPS, Setting, in_group

ROOT = pathlib.Path(__file__).resolve().parents[1]
BEGIN = "<!-- settings: generated from rllib_p3o/core/settings.py by `make reference`; do not edit by hand -->"
END = "<!-- settings: end -->"
REFERENCE = ROOT / "docs" / "reference" / "configuration.md"
SIGNATURE = ROOT / "rllib_p3o" / "driver" / "training_signature.py"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default_text(s: Setting) -> str:
    value = s.default()
    return "None" if value is None else f"`{value!r}`"


def reference_markdown() -> str:
    """The generated part of the configuration reference: one table per group, then the registered losses and the
    keys each takes in ``loss_config``."""
    lines: List[str] = []
    for group in GROUPS:
        lines += [f"### {group.capitalize()}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for s in in_group(group):
            meaning = s.help
            if s.resettable:
                meaning += " *May change between trials that reuse a Tune actor.*"
            lines.append(f"| `{s.keyword}` | `{_cell(s.type)}` | {_default_text(s)} | {_cell(meaning)} |")
        lines.append("")
    lines += [
        "### Registered losses and their `loss_config`",
        "",
        "| `loss` | `loss_config` keys (defaults) | formula |",
        "|---|---|---|",
    ]
    for name in sorted(LOSSES):
        spec = LOSSES[name]
        keys = ", ".join(
            f"`{f.name}={f.default!r}`"
            for f in dataclasses.fields(spec.settings)
            if f.default is not dataclasses.MISSING
        )
        doc = " ".join((spec.fn.__doc__ or "").strip().split("\n\n")[0].split())
        lines.append(f"| `{name}` | {keys or '(none)'} | {_cell(doc)} |")
    return "\n".join(lines) + "\n"


def render_page(page: str) -> str:
    """``page`` with the part between `BEGIN` and `END` replaced by `reference_markdown`."""
    head, found, rest = page.partition(BEGIN)
    if not found:
        raise ValueError(f"{REFERENCE} has no {BEGIN!r} marker")
    _, found, tail = rest.partition(END)
    if not found:
        raise ValueError(f"{REFERENCE} has no {END!r} marker")
    return f"{head}{BEGIN}\n\n{reference_markdown()}\n{END}{tail}"


def _default_repr(s: Setting) -> str:
    value = s.default()
    return repr(value) if not isinstance(value, str) else f'"{value}"'


def signature_module() -> str:
    """The source of `rllib_p3o.driver.training_signature`: ``TrainingSignature.training`` with one keyword argument
    per setting (its declared type, RLlib's ``NotProvided`` as default: unset keys keep their value) and a docstring
    listing each with its group, type, default and help text (what ``help()`` and IDEs show)."""
    params, doc = [], []
    for group in GROUPS:
        doc.append(f"            {group.capitalize()}:")
        for s in in_group(group):
            params.append(f"        {s.keyword}: {s.type} = NotProvided,")
            doc.extend(
                textwrap.wrap(
                    f"{s.keyword} ({s.type}, default {_default_repr(s)}): {s.help}",
                    width=116,
                    initial_indent=" " * 16,
                    subsequent_indent=" " * 20,
                    break_on_hyphens=False,
                )
            )
    body = "\n".join(params)
    settings_doc = "\n".join(doc)
    used = sorted(n for n in ("Any", "Dict", "List", "Optional", "Tuple", "Union") if n == "Any" or n + "[" in body)
    return f'''"""The signature of ``P3OConfig.training``: one keyword argument per P3O setting, with its type and default.

Generated from `rllib_p3o.core.settings` by ``make reference`` (`devtools.reference`): do not edit by hand;
``tests/test_settings.py`` fails when it is stale. ``P3OConfig`` inherits ``training`` from here, so that ``help()`` and
an IDE show every setting; the work is ``P3OConfig._set_training``'s.
"""

from __future__ import annotations

from typing import {", ".join(used)}

from ray.rllib.algorithms.algorithm_config import NotProvided
from typing_extensions import Self


class TrainingSignature:
    """``training`` with every P3O setting as a keyword argument (`rllib_p3o.core.settings`)."""

    def training(
        self,
        *,
{body}
        **kwargs: Any,
    ) -> Self:
        """Sets the training options: P3O's own (below; their meaning: the configuration reference,
        docs/reference/configuration.md) and RLlib's (``lr``, ``grad_clip``, ``num_epochs``, ``minibatch_size``, ...).
        A key left out keeps its value; an unknown key raises TypeError, as RLlib's ``training`` does. Relative paths
        (``model``, ``behavior_models``' models, ``offline_rescore_model``, ``record_rollouts``) are resolved here,
        where the script runs.

        P3O's settings (group, then key (type, default): what it does):

{settings_doc}
        """
        settings: Dict[str, Any] = {{k: v for k, v in locals().items() if k not in ("self", "kwargs", "__class__")}}
        return self._set_training(settings, kwargs)  # type: ignore[attr-defined]
'''


def _check_or_write(path: pathlib.Path, fresh: str, write: bool) -> bool:
    if write:
        path.write_text(fresh)
        return True
    if path.read_text() != fresh:
        print(f"{path} is stale: run make reference", file=sys.stderr)
        return False
    return True


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite both files (default: exit 1 if one is stale)")
    args = parser.parse_args(argv)
    ok = _check_or_write(REFERENCE, render_page(REFERENCE.read_text()), args.write)
    ok = _check_or_write(SIGNATURE, signature_module(), args.write) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
