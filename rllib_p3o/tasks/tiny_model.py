"""Build a tiny causal LM and a tokenizer trained locally, saved as an ordinary Hugging Face directory.

Nothing is downloaded: the tokenizer is trained with `tokenizers` on the task's text and the model is a
randomly initialized `transformers` config. The result loads through exactly the code path a user's hub or
local model does (``AutoModelForCausalLM`` / ``AutoTokenizer`` / ``vllm.LLM``). head_dim is 64 because vLLM's
CPU attention backend rejects smaller heads.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Union

PAD, EOS = "<pad>", "<eos>"
# Architectures `build_tiny_model` builds: transformers' ``model_type`` -> settings that differ from its config
# class's defaults beyond the shared sizes (each test builds these as a user's checkpoint of that family would be).
ARCHITECTURES: Dict[str, Dict[str, Any]] = {
    "qwen2": {},
    "qwen3": {},
    "llama": {},
    "mistral": {"sliding_window": None},
    "gemma": {"hidden_act": "gelu_pytorch_tanh"},
    "gemma2": {"query_pre_attn_scalar": 64, "sliding_window": 64},
    "phi3": {},
}
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
CHAT_TOKENS = (IM_START, IM_END)
"""ChatML-style turn markers, for `build_tiny_model`'s ``special_tokens``: each one token, dropped from decoded text.
A model turn ends at ``IM_END`` when it is among the stop tokens (``env_config["stop_tokens"]``)."""
CHAT_TEMPLATE = (
    "{% for m in messages %}" + IM_START + "{{ m['role'] }} {{ m['content'] }}" + IM_END + "{% endfor %}"
    "{% if add_generation_prompt %}" + IM_START + "assistant {% endif %}"
)
"""A chat template over `CHAT_TOKENS`, for `build_tiny_model`'s ``chat_template``: each message as
``<|im_start|>role content<|im_end|>``, then ``<|im_start|>assistant `` to prompt the model's turn. Conversational
prompts and multi-turn environments (verifiers', OpenEnv's, tool use in chat) need a template; the role names belong
in the tokenizer's corpus (``"system user assistant"``)."""


def build_tokenizer(
    corpus: Iterable[str],
    vocab_size: int = 64,
    special_tokens: Sequence[str] = (),
    added_tokens: Sequence[str] = (),
    chat_template: Optional[str] = None,
):
    """A byte-free BPE tokenizer trained on ``corpus``, with digits always split into single tokens.

    Each of ``special_tokens`` (e.g. `CHAT_TOKENS`) and ``added_tokens`` is one token, never split; special tokens
    are dropped when text is decoded with ``skip_special_tokens``, added ones (e.g. tool-call tags, as Qwen's
    ``<tool_call>``) are kept.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    tok.decoder = decoders.BPEDecoder()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[PAD, EOS, *special_tokens], show_progress=False
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, additional_special_tokens=list(special_tokens)
    )
    out.add_tokens(list(added_tokens))
    if chat_template is not None:
        out.chat_template = chat_template
    return out


def build_tiny_model(
    path: str,
    corpus: Optional[Iterable[str]] = None,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 256,
    tie_word_embeddings: bool = True,
    max_position_embeddings: int = 128,
    vocab_size: int = 64,
    init_std: float = 0.02,
    seed: int = 0,
    special_tokens: Sequence[str] = (),
    added_tokens: Sequence[str] = (),
    chat_template: Optional[str] = None,
    architecture: str = "qwen2",
    overwrite: bool = False,
) -> str:
    """Write a tiny causal LM (Qwen2 unless ``architecture``, one of `ARCHITECTURES`) + tokenizer to ``path`` and
    return ``path``: randomly initialized, nothing downloaded, loaded by transformers and vLLM as any model is.

    ``corpus``: lines of text the tokenizer is trained on, covering every word and symbol the task's prompts and
    answers use (digits are always single tokens); it defaults to the built-in arithmetic task's text.
    ``special_tokens``, ``added_tokens`` and ``chat_template`` go to the tokenizer (`build_tokenizer`): with
    ``special_tokens=CHAT_TOKENS, chat_template=CHAT_TEMPLATE`` (and the role names in ``corpus``) it renders chat
    messages. An existing directory built with the same arguments and the default corpus is reused unless
    ``overwrite``.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture {architecture!r} is not one of {sorted(ARCHITECTURES)}")
    args = dict(
        architecture=architecture,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        tie_word_embeddings=tie_word_embeddings,
        max_position_embeddings=max_position_embeddings,
        vocab_size=vocab_size,
        init_std=init_std,
        seed=seed,
        custom_corpus=corpus is not None,
        special_tokens=list(special_tokens),
        added_tokens=list(added_tokens),
        chat_template=chat_template,
    )
    stamp = os.path.join(path, "build_args.json")
    if not overwrite and corpus is None and os.path.exists(stamp):
        with open(stamp) as f:
            if json.load(f) == args:
                return path
    if corpus is None:
        from rllib_p3o.tasks.arithmetic import ArithmeticTask

        corpus = ArithmeticTask().corpus()
    tokenizer = build_tokenizer(
        corpus,
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        added_tokens=added_tokens,
        chat_template=chat_template,
    )
    config = AutoConfig.for_model(
        architecture,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        initializer_range=init_std,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **ARCHITECTURES[architecture],
    )
    if hidden_size // num_heads != 64:
        raise ValueError(
            f"head_dim = hidden_size / num_heads must be 64 for vLLM on CPU, got {hidden_size // num_heads}"
        )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    with open(stamp, "w") as f:
        json.dump(args, f)
    return path


def build_tiny_reward_model(
    path: str,
    tokenizer_from: str,
    *,
    num_labels: int = 1,
    hidden_size: int = 64,
    num_layers: int = 1,
    seed: int = 0,
    init_std: float = 0.2,
) -> str:
    """Write a tiny Qwen2 sequence classifier (a reward model: ``num_labels`` logits read at the last token) with the
    tokenizer of the model directory ``tokenizer_from`` to ``path``, and return ``path``. Randomly initialized (a
    large ``init_std`` spreads its scores): for tests and examples of reward models served by actors."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    config = AutoConfig.for_model(
        "qwen2",
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=hidden_size // 2,
        max_position_embeddings=256,
        initializer_range=init_std,
        num_labels=num_labels,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_demo_model(
    path: str,
    *,
    pretrain_steps: int = 1500,
    seed: int = 0,
    format_fraction: float = 0.3,
    correct_fraction: float = 0.4,
    overwrite: bool = False,
    progress: Union[Callable[[int, float], None], bool, None] = True,
) -> str:
    """The demo's base model: `build_tiny_model` + a short pretraining on `ArithmeticTask.pretraining_corpus`.

    ``seed`` sets the initialization, the format lines and the pretraining batches. Cached: a directory already
    built with the same settings is reused (the first build takes about a minute on 2 free cores, several on busy
    ones).

    ``progress``: True prints a line as the pretraining starts and about every 10 s with the time left
    (`PretrainingProgress`), so that the minutes are not silent; False (or None) prints nothing; a function gets
    ``(step, loss)`` every 50 steps.
    """
    import torch

    from rllib_p3o.tasks.arithmetic import ArithmeticTask
    from rllib_p3o.tasks.model_cache import built_with, mark_built
    from rllib_p3o.tasks.pretrain import PretrainingProgress, pretrain_causal_lm

    args = {
        "pretrain_steps": pretrain_steps,
        "seed": seed,
        "format_fraction": format_fraction,
        "correct_fraction": correct_fraction,
        "threads": torch.get_num_threads(),
        "version": 3,
    }
    if not overwrite and built_with(path, args):
        return path
    if progress is True:
        progress = PretrainingProgress(f"building the demo's base model in {path}: ", pretrain_steps)
    build_tiny_model(path, seed=seed, overwrite=True)
    corpus = ArithmeticTask().pretraining_corpus(
        format_fraction=format_fraction, correct_fraction=correct_fraction, seed=seed
    )
    pretrain_causal_lm(path, corpus, steps=pretrain_steps, seed=seed, progress=progress or None)
    mark_built(path, args)
    return path


def build_bench_model(
    path: str,
    task: Any,
    *,
    pretrain_steps: int,
    seed: int,
    format_fraction: float,
    correct_fraction: float,
    overwrite: bool,
    progress: Optional[Callable[[int, float], None]],
) -> str:
    """A bench task's base model (`build_sorting_model`, `build_addition_model`): a tiny Qwen2 whose tokenizer is
    trained on ``task.corpus()``, pretrained on ``task.pretraining_corpus(...)``; reused when ``path`` was built with
    the same settings and thread count (`model_cache`)."""
    import torch

    from rllib_p3o.tasks.model_cache import built_with, mark_built
    from rllib_p3o.tasks.pretrain import pretrain_causal_lm

    settings = {
        "task": task.__dict__,
        "pretrain_steps": pretrain_steps,
        "seed": seed,
        "format_fraction": format_fraction,
        "correct_fraction": correct_fraction,
        "threads": torch.get_num_threads(),
        "version": 1,
    }
    if not overwrite and built_with(path, settings):
        return path
    build_tiny_model(path, task.corpus(), seed=seed, overwrite=True, max_position_embeddings=64)
    corpus = task.pretraining_corpus(format_fraction=format_fraction, correct_fraction=correct_fraction, seed=seed)
    pretrain_causal_lm(path, corpus, steps=pretrain_steps, seed=seed, progress=progress)
    mark_built(path, settings)
    return path
