"""Short next-token pretraining of a local base model on a text corpus (used to build the demo's base model).

Real users start from a pretrained hub or local model; the demo builds its own tiny one, so it pretrains it
here for a minute on knowledge the RL task can build on (see `ArithmeticTask.pretraining_corpus`).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional, Sequence

import torch

logger = logging.getLogger(__name__)

# Seconds between the default progress lines of a pretraining (`PretrainingProgress`).
PROGRESS_EVERY_S = 10.0


class PretrainingProgress:
    """The default screen of a built-in base model's pretraining (`rllib_p3o.tasks.build_demo_model`, `make demo`): a
    line at the first step, then one at least every ``every_s`` seconds and at the last step, with the step, the loss
    and the time so far, each after ``prefix``. Without it, building the demo's base model in a script is minutes
    with nothing on the screen."""

    def __init__(
        self,
        prefix: str,
        steps: int,
        every_s: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        out: Callable[[str], None] = lambda line: print(line, flush=True),
    ):
        self.prefix, self.steps, self.every_s = prefix, steps, every_s
        self._clock, self._out = clock, out
        self._started = self._last = None

    def __call__(self, step: int, loss: float) -> None:
        now = self._clock()
        if self._started is None:
            self._started = now
        elif now - self._last < self.every_s and step < self.steps - 1:
            return
        self._last = now
        elapsed = now - self._started
        # The time left at the pace so far: how long pretraining takes depends on how busy the machine is (about a
        # minute on 2 idle cores, five beside two busy processes), so the line says it rather than the docs alone.
        left = (self.steps - 1 - step) * elapsed / step if 0 < step < self.steps - 1 else None
        self._out(
            f"{self.prefix}pretraining step {step + 1}/{self.steps}, loss {loss:.3f} ({_clock(elapsed)}"
            + (f", about {_clock(left)} left)" if left is not None else ")")
        )


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


def pretrain_causal_lm(
    path: str,
    corpus: Sequence[str],
    *,
    steps: int = 600,
    batch_size: int = 128,
    lr: float = 1e-3,
    seed: int = 0,
    progress: Optional[Callable[[int, float], None]] = None,
) -> str:
    """Next-token training of the model at ``path`` on ``corpus`` (each line + EOS), saved back in place."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    enc = [tok(line).input_ids + [tok.eos_token_id] for line in corpus]
    width = max(map(len, enc))
    ids = torch.full((len(enc), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(enc):
        ids[i, : len(e)] = torch.as_tensor(e)
        mask[i, : len(e)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        idx = torch.randint(len(enc), (batch_size,), generator=gen)
        loss = model(input_ids=ids[idx], attention_mask=mask[idx], labels=labels[idx]).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if progress is not None and (step % 50 == 0 or step == steps - 1):
            progress(step, loss.item())
    logger.info("pretrained %s for %d steps in %.0fs", path, steps, time.perf_counter() - t0)
    model.save_pretrained(path)
    return path
