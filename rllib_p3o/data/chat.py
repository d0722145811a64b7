"""Prompts and environment turns as token ids: plain strings, or chat messages rendered with the tokenizer's template.

A row's ``prompt`` is either a string (encoded with the tokenizer's special tokens) or a list of chat messages
``[{"role": "system"|"user"|"assistant"|"tool", "content": str}, ...]`` (TRL's conversational format), rendered with
``tokenizer.apply_chat_template(messages, add_generation_prompt=True)`` straight to token ids.

Token-exactness (multi-turn). An episode's sequence is the engine's own ids for model turns and the tokenizer's
encoding of environment turns, appended: model output is never decoded and re-encoded (a decode/encode round trip
can change ids, and the behavior log-probs would then belong to other tokens). `env_turn_ids` therefore renders
the environment's new messages *on their own*, as the template would continue a conversation after an assistant
turn, and never re-renders the history.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Sequence, Union

import numpy as np

from rllib_p3o.core.config_error import ConfigError

ROLES = ("system", "user", "assistant", "tool")
Message = Mapping[str, Any]
Messages = List[Message]
Prompt = Union[str, Messages]

# The conversation `env_turn_ids` renders new messages after: any content works, the prefix cancels out.
_ANCHOR: Messages = [{"role": "user", "content": "."}, {"role": "assistant", "content": "."}]


class ChatTemplateError(ConfigError):
    """Conversational data needs a tokenizer with a chat template; the message names the model."""


def is_conversational(prompt: Any) -> bool:
    """A prompt given as chat messages (a list; an object array where Ray Data read it from Parquet), not a string."""
    return isinstance(prompt, (list, tuple)) or (isinstance(prompt, np.ndarray) and prompt.dtype == object)


def message_problem(prompt: Any) -> Optional[str]:
    """Why ``prompt`` is not a valid list of chat messages, or None when it is."""
    if not is_conversational(prompt) or len(prompt) == 0:
        return "must be a non-empty list of messages"
    for i, m in enumerate(prompt):
        if not isinstance(m, Mapping) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            return f"message {i} must be {{'role': one of {ROLES}, 'content': str}}, got {m!r:.120}"
    return None


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def check_chat_template(tokenizer: Any, model: str) -> None:
    """Raise `ChatTemplateError` naming ``model`` when its tokenizer cannot render chat messages."""
    if not has_chat_template(tokenizer):
        raise ChatTemplateError(
            f"the data has conversational prompts (lists of chat messages), but the tokenizer of {model} has no "
            "chat template: use a chat (instruction-tuned) model, set tokenizer.chat_template, or give the prompts "
            "as strings. For a tiny model to try a task on CPU, build one with a template: build_tiny_model(path, "
            "corpus, special_tokens=CHAT_TOKENS, chat_template=CHAT_TEMPLATE), all three from rllib_p3o.tasks."
        )


def _template_ids(tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool) -> List[int]:
    # transformers 5 returns a BatchEncoding unless return_dict=False.
    return list(
        tokenizer.apply_chat_template(
            [dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
        )
    )


def prompt_token_ids(tokenizer: Any, prompt: Prompt) -> List[int]:
    """The token ids of a prompt as the engine receives it (see the module docstring)."""
    if is_conversational(prompt):
        return _template_ids(tokenizer, prompt, add_generation_prompt=True)
    return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])


def prompt_text(tokenizer: Any, prompt: Prompt) -> str:
    """The prompt as text (rendered with the template when conversational), for records and logs."""
    if is_conversational(prompt):
        return tokenizer.apply_chat_template([dict(m) for m in prompt], add_generation_prompt=True, tokenize=False)
    return prompt


def env_turn_ids(tokenizer: Any, messages: Sequence[Message], after_token: Optional[int]) -> List[int]:
    """Token ids of the environment's ``messages`` as the chat template continues a conversation after an assistant
    turn, up to and including the next assistant generation prompt.

    Rendered on a fixed anchor conversation (user, assistant): the ids of ``anchor + messages`` (with generation
    prompt) minus those of ``anchor``. The anchor's assistant turn ends with what the template puts after an
    end-of-turn token (e.g. ChatML's newline after ``<|im_end|>``); the engine stops *at* that token, so when the
    model's turn ended with ``after_token`` and the anchor has it, whatever the template writes after it is part of
    the environment's turn too.
    """
    anchor = _template_ids(tokenizer, _ANCHOR, add_generation_prompt=False)
    full = _template_ids(tokenizer, list(_ANCHOR) + list(messages), add_generation_prompt=True)
    if full[: len(anchor)] != anchor:
        raise ChatTemplateError(
            "the chat template renders a conversation's history differently once messages follow it, so environment "
            "turns cannot be appended token-exactly; give the environment a template that only appends."
        )
    tail: List[int] = []
    if after_token is not None and after_token in anchor:
        tail = anchor[len(anchor) - anchor[::-1].index(after_token) :]
    return tail + full[len(anchor) :]


def text_turn_ids(tokenizer: Any, text: str) -> List[int]:
    """Token ids of an environment turn given as plain text (no chat template): encoded as a continuation."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
