"""Prompts that fit the model's context: a prompt longer than the context minus ``max_tokens`` is named before any
engine starts (``overlong_prompts="error"``), left out (``"drop"``) or cut from the left (``"truncate_left"``).

Without this, one such row makes vLLM refuse to start (its ``max_model_len`` would exceed the model's), naming
neither the dataset nor the row, and the only remedy it shows produces wrong results. Both the driver (at config
validation: the error) and every runner (at start: the same rows dropped or cut, so the driver's prompt schedule and
every runner index the same rows) apply `fit_prompts` with the same tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from rllib_p3o.data import chat
from rllib_p3o.data.datasets import DatasetError, load_prompt_dataset

# A row's prompt token ids when `fit_prompts` cut them (the runner sends these instead of encoding the prompt).
PROMPT_IDS = "prompt_token_ids"
OVERLONG_PROMPTS = ("error", "drop", "truncate_left")


class OverlongPromptError(DatasetError):
    """A prompt longer than the model's context minus ``max_tokens``; names the dataset, row, length and limit."""


@dataclass(frozen=True)
class PromptFit:
    rows: List[Dict[str, Any]]
    dropped: int = 0
    truncated: int = 0


def prompt_limit(context: int, max_tokens: int) -> int:
    """Tokens a prompt may have: the context minus what the completion may take."""
    return int(context) - int(max_tokens)


def fit_prompts(
    rows: Sequence[Dict[str, Any]],
    encode: Callable[[Any], List[int]],
    context: int,
    max_tokens: int,
    policy: str,
    where: str,
) -> PromptFit:
    """``rows`` whose ``encode(row["prompt"])`` fits ``context - max_tokens`` tokens, per ``policy`` (module
    docstring): ``"error"`` raises `OverlongPromptError` at the first row that does not fit; ``"drop"`` leaves such
    rows out; ``"truncate_left"`` keeps their last tokens under `PROMPT_IDS`. Rows that fit are returned as they are.
    """
    if policy not in OVERLONG_PROMPTS:
        raise ValueError(f"overlong_prompts must be one of {', '.join(OVERLONG_PROMPTS)}, got {policy!r}")
    limit = prompt_limit(context, max_tokens)
    if limit < 1:
        raise OverlongPromptError(
            f"max_tokens={max_tokens} leaves no room for a prompt in the model's context of {context} tokens: lower "
            "max_tokens."
        )
    kept: List[Dict[str, Any]] = []
    dropped = truncated = 0
    for i, row in enumerate(rows):
        ids = encode(row["prompt"])
        if len(ids) <= limit:
            kept.append(row)
            continue
        if policy == "error":
            raise OverlongPromptError(
                f"{where}: row {i}: the prompt is {len(ids)} tokens (chat template applied), longer than the model's "
                f"context of {context} minus max_tokens={max_tokens} = {limit}. Shorten it, lower max_tokens, or set "
                ".training(overlong_prompts='drop') to leave such rows out or 'truncate_left' to keep their last "
                f"{limit} tokens."
            )
        if policy == "drop":
            dropped += 1
            continue
        truncated += 1
        kept.append({**row, PROMPT_IDS: list(ids[-limit:])})
    if not kept:
        raise OverlongPromptError(
            f"{where}: every one of its {len(rows)} prompts is longer than the model's context of {context} minus "
            f"max_tokens={max_tokens}; overlong_prompts='drop' left none."
        )
    return PromptFit(kept, dropped, truncated)


def row_prompt_ids(row: Dict[str, Any], encode: Callable[[Any], List[int]]) -> List[int]:
    """The token ids a row's prompt is sent as: its cut ids (`PROMPT_IDS`) when `fit_prompts` cut it, else encoded."""
    ids: Optional[List[int]] = row.get(PROMPT_IDS)
    return list(ids) if ids is not None else encode(row["prompt"])


def model_context(model: str, trust_remote_code: bool = False, engine_kwargs: Optional[Dict[str, Any]] = None) -> int:
    """The context the engine gets: ``engine_kwargs["max_model_len"]`` if set, else the model config's
    ``max_position_embeddings``."""
    if engine_kwargs and engine_kwargs.get("max_model_len"):
        return int(engine_kwargs["max_model_len"])
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    config = getattr(config, "text_config", None) or config
    return int(config.max_position_embeddings)


# (dataset, model, context, max_tokens) already checked in this process: a config is validated more than once.
_CHECKED: set = set()


def check_dataset_fits(
    dataset: Any, name: str, model: str, trust_remote_code: bool, context: int, max_tokens: int
) -> None:
    """`OverlongPromptError` for the first row of a prompt dataset (a path or rows) longer than ``context -
    max_tokens`` tokens with ``model``'s tokenizer (the chat template applied)."""
    key = (dataset if isinstance(dataset, str) else id(dataset), model, context, max_tokens)
    if key in _CHECKED:
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=trust_remote_code)
    rows = load_prompt_dataset(dataset, name)
    where = f"{name} {dataset}" if isinstance(dataset, str) else f"env_config['{name}']"
    fit_prompts(rows, lambda p: chat.prompt_token_ids(tokenizer, p), context, max_tokens, "error", where)
    _CHECKED.add(key)
