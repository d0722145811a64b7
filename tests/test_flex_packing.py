"""Packed rows under flex attention (block-sparse masks) give the padded rows' log-probs, as under SDPA (dense masks).

Issue 55, item 2: on one H200 (torch 2.11, transformers 5.17, bf16 autocast) the learner's packing check measured the
flex-attention packed log-probs 0.64 off the padded ones and turned packing off. These tests pin down our half of
that path on the tiny Qwen2 (head_dim 64) in float32: the position ids `pack_rows` writes, the BlockMask transformers
builds from them, and the attention computed through that BlockMask (or one we build ourselves from per-sequence ids)
all equal the padded rows to 1e-4, so an inexact packed forward is the kernel's doing, not the packing's.

On a CPU flex attention runs eagerly here: transformers compiles it (and ``create_block_mask``) with inductor, which
takes minutes on a busy 2-core machine; the eager implementation evaluates the same BlockMask's ``mask_mod`` on every
position. On CUDA the compiled kernel transformers uses in training runs, so a GPU session reproduces (or rules out)
the gap with this file.
"""

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from rllib_p3o.learner import compute
from rllib_p3o.learner.compute import TOKEN_LOGP, TokenLogprobs
from rllib_p3o.learner.packing import pack_capacity, pack_rows, plan_packing, unpack_token_values

flex = pytest.importorskip("torch.nn.attention.flex_attention", reason="this torch has no flex attention")
from transformers import masking_utils  # noqa: E402
from transformers.integrations import flex_attention as hf_flex  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

# Lengths with a 12-position packed width (`pack_capacity` for the masked backends): 12 | 9+3 | 7+4 and a free tail
# position after the 7+4 row, so a tail that continues the last sequence's positions is covered too.
LENGTHS = np.array([12, 7, 9, 4, 3])
ATOL = 1e-4
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.fixture
def eager_flex_on_cpu(monkeypatch, request):
    """On a CPU, transformers' flex attention and its ``create_block_mask`` run uncompiled (see the module docstring);
    on CUDA they stay compiled, as in training."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("device", "cpu") != "cpu":
        return
    monkeypatch.setattr(
        hf_flex,
        "compile_friendly_flex_attention",
        lambda q, k, v, training=False, **kw: flex.flex_attention(q, k, v, **kw),
    )
    create = masking_utils.create_block_mask
    monkeypatch.setattr(masking_utils, "create_block_mask", lambda *a, **kw: create(*a, **{**kw, "_compile": False}))


def _batch(vocab: int, device: str):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (len(LENGTHS), int(LENGTHS.max())), generator=g).to(device)
    valid = (torch.arange(ids.shape[1] - 1)[None] < torch.as_tensor(LENGTHS)[:, None] - 1).to(device)
    return ids, valid


def _logp(lm, ids, **inputs) -> torch.Tensor:
    """Log-prob of each next token, float32, ``[rows, width - 1]``."""
    with torch.no_grad():
        logits = lm(input_ids=ids, use_cache=False, **inputs).logits[:, :-1].float()
    return logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]


def _document_ids(plan, width: int) -> torch.Tensor:
    """``[num_packed, width]``: which sequence of its packed row each position holds; -1 after the last one."""
    doc = torch.full((plan.num_packed, width), -1, dtype=torch.long)
    for i, (row, start, n) in enumerate(zip(plan.packed_row, plan.offset, plan.lengths)):
        doc[row, start : start + n] = i
    return doc


@pytest.fixture(scope="module")
def models(tiny_model):
    """``models(device)``: the tiny model under SDPA and under flex attention (the same weights), loaded once."""
    loaded = {}

    def get(device: str):
        if device not in loaded:
            loaded[device] = {
                attn: AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=attn, dtype=torch.float32)
                .to(device)
                .eval()
                for attn in ("sdpa", "flex_attention")
            }
        return loaded[device]

    return get


@pytest.mark.parametrize("one_row", [False, True], ids=["packed_width", "one_packed_row"])
@pytest.mark.parametrize("device", DEVICES)
def test_packed_flex_and_sdpa_log_probs_equal_the_padded_ones(models, eager_flex_on_cpu, device, one_row):
    """Per-token log-probs of rows of different lengths, float32: (a) padded, one row each, SDPA (the reference);
    packed by `pack_rows` with (b) SDPA and the block-diagonal mask transformers builds from the restarting position
    ids, (b') SDPA and our own dense block-diagonal mask, (c) flex attention and the BlockMask transformers builds,
    (c') flex attention and our own BlockMask from per-sequence ids. Each packed path equals (a) within 1e-4."""
    lms = models(device)
    ids, valid = _batch(lms["sdpa"].config.vocab_size, device)
    width = ids.shape[1]
    capacity = int(LENGTHS.sum()) if one_row else pack_capacity(LENGTHS, "flex_attention")
    plan = plan_packing(LENGTHS, capacity)
    packed_ids, positions = pack_rows(ids, plan)
    doc = _document_ids(plan, plan.width).to(device)
    causal = torch.ones(plan.width, plan.width, dtype=torch.bool, device=device).tril()
    dense = (causal & (doc[:, :, None] == doc[:, None, :]))[:, None]  # [num_packed, 1, width, width]

    def document_causal(b, h, q, kv):
        return (q >= kv) & (doc[b, q] == doc[b, kv])

    block_mask = flex.create_block_mask(
        document_causal, B=plan.num_packed, H=None, Q_LEN=plan.width, KV_LEN=plan.width, device=device
    )
    padded = _logp(lms["sdpa"], ids)
    paths = {
        "sdpa, transformers' mask": _logp(lms["sdpa"], packed_ids, position_ids=positions),
        "sdpa, dense block-diagonal": _logp(lms["sdpa"], packed_ids, position_ids=positions, attention_mask=dense),
        "flex, transformers' BlockMask": _logp(lms["flex_attention"], packed_ids, position_ids=positions),
        "flex, document BlockMask": _logp(
            lms["flex_attention"], packed_ids, position_ids=positions, attention_mask=block_mask
        ),
    }
    gaps = {
        name: float((unpack_token_values(logp, plan, width) - padded)[valid].abs().max())
        for name, logp in paths.items()
    }
    # Flex attention padded as well: a gap between the backends themselves would show here, not as a packing gap.
    gaps["flex, padded"] = float((_logp(lms["flex_attention"], ids) - padded)[valid].abs().max())
    assert all(gap <= ATOL for gap in gaps.values()), gaps


def test_the_block_mask_transformers_builds_from_packed_position_ids_is_block_diagonal_causal(
    models, eager_flex_on_cpu
):
    """The BlockMask of the flex path, evaluated on every (query, key) position of the packed rows, is exactly the
    causal mask within each sequence (the tail after a packed row's last sequence belongs to that sequence, as its
    positions continue it): no position sees another sequence, and each sees all of its own past."""
    config = models("cpu")["flex_attention"].config
    plan = plan_packing(LENGTHS, pack_capacity(LENGTHS, "flex_attention"))
    _, positions = pack_rows(torch.zeros(len(LENGTHS), int(LENGTHS.max()), dtype=torch.long), plan)
    embeds = torch.zeros(plan.num_packed, plan.width, config.hidden_size)
    mask = masking_utils.create_causal_mask(config, embeds, None, None, position_ids=positions)
    assert isinstance(mask, flex.BlockMask) and mask.shape[-2:] == (plan.width, plan.width)
    doc = _document_ids(plan, plan.width)
    for row in range(plan.num_packed):  # the tail continues the row's last sequence
        members = np.flatnonzero(plan.packed_row == row)
        doc[row][doc[row] < 0] = int(members[np.argmax(plan.offset[members])])
    q, kv = torch.meshgrid(torch.arange(plan.width), torch.arange(plan.width), indexing="ij")
    expected = (q >= kv) & (doc[:, :, None] == doc[:, None, :])
    got = torch.stack([mask.mask_mod(torch.tensor(b), torch.tensor(0), q, kv) for b in range(plan.num_packed)])
    assert torch.equal(got, expected)


@pytest.mark.parametrize("restart", [True, False])
def test_the_packing_check_accepts_flex_attention_only_when_packed_rows_keep_apart(
    tiny_model, eager_flex_on_cpu, monkeypatch, restart
):
    """The learner's check (`TokenLogprobs.prepare`) under flex attention turns packing on when the packed forward
    is exact, and keeps it off when the position ids do not restart (the rows would attend to each other)."""
    if not restart:
        original = compute.pack_rows

        def positions_without_restarts(input_ids, plan):
            packed, positions = original(input_ids, plan)
            return packed, torch.arange(positions.shape[1]).expand_as(positions)

        monkeypatch.setattr(compute, "pack_rows", positions_without_restarts)
    lm = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="flex_attention", dtype=torch.float32)
    core = TokenLogprobs(lm, pack_sequences=True)
    core.prepare("cpu")
    assert core.packing is restart
    if restart:  # and then the learner's packed log-probs are the padded ones
        ids, valid = _batch(lm.config.vocab_size, "cpu")
        mask = (torch.arange(ids.shape[1])[None] < torch.as_tensor(LENGTHS)[:, None]).long()
        with torch.no_grad():  # flex attention has no backward on a CPU
            packed = core.token_logprobs(ids, mask)[TOKEN_LOGP]
        lm.set_attn_implementation("sdpa")
        padded = _logp(lm, ids)
        assert float((packed - padded)[valid].abs().max()) <= ATOL
