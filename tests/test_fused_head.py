"""`rllib_p3o.learner.fused_head`: the fused LM head gives today's head's log-probs and gradients (float32, within
1e-5) at Qwen's vocabulary and on kept sets of every kind, and never builds a [tokens, vocabulary] tensor of all
tokens (checked op by op, where the reference head fails the same check)."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from rllib_p3o.core.columns import KEPT_OVERFLOW
from rllib_p3o.learner.compute import _softcap, head_from_logits
from rllib_p3o.learner.fused_head import fused_token_logprobs

QWEN_VOCAB = 151_936
ATOL = 1e-5


def reference(hidden, weight, targets, bias=None, kept_ids=None, softcap=None):
    """Today's head (`TokenLogprobs._head_from_hidden`): full logits, soft-cap, log-softmax, gather, and the kept-set
    renormalization of `compute.kept_set_log_mass`."""
    return head_from_logits(_softcap(F.linear(hidden, weight, bias), softcap), targets, False, kept_ids)[0]


def leaves(hidden_dim, vocab, tokens, *, bias=True, head_trains=True, hidden_trains=True, seed=0, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, hidden_dim, generator=g).requires_grad_(hidden_trains)
    weight = (scale * torch.randn(vocab, hidden_dim, generator=g)).requires_grad_(head_trains)
    b = (torch.randn(vocab, generator=g)).requires_grad_(head_trains) if bias else None
    targets = torch.randint(0, vocab, (tokens,), generator=g)
    upstream = torch.randn(tokens, generator=g)
    return hidden, weight, b, targets, upstream


def kept_sets(targets, vocab, width=6, seed=1):
    """Kept sets of every kind: full rows (target inside), padded rows, all-padding rows (no set), overflow rows,
    a target outside its set, an id listed twice, a set of one."""
    g = torch.Generator().manual_seed(seed)
    kept = torch.randint(0, vocab, (len(targets), width), generator=g)
    kept[:, 0] = targets  # the sampled token is in its set
    kept[1::5, 3:] = -1  # padded
    kept[2::5] = -1  # no set: sampled untruncated
    kept[3::5, 0] = KEPT_OVERFLOW  # overflowed: the full distribution
    kept[3::5, 1:] = -1
    kept[4::5, 0] = (targets[4::5] + 1) % vocab  # the target outside its set
    kept[5::7, 2] = kept[5::7, 1]  # an id twice: counted twice, as kept_set_log_mass does
    kept[6::7, 1:] = -1  # a set of one
    return kept


def grads(out, upstream, tensors):
    wanted = [t for t in tensors if t is not None and t.requires_grad]
    return torch.autograd.grad((out * upstream).sum(), wanted)


def assert_same(hidden, weight, targets, upstream, bias=None, kept_ids=None, softcap=None, chunk_tokens=7):
    ref = reference(hidden, weight, targets, bias, kept_ids, softcap)
    fused = fused_token_logprobs(
        hidden, weight, targets, bias=bias, kept_ids=kept_ids, chunk_tokens=chunk_tokens, softcap=softcap
    )
    assert fused.dtype == torch.float32 and fused.shape == targets.shape
    torch.testing.assert_close(fused, ref, atol=ATOL, rtol=0)
    for got, want in zip(grads(fused, upstream, (hidden, weight, bias)), grads(ref, upstream, (hidden, weight, bias))):
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@pytest.mark.parametrize("with_kept", [False, True], ids=["full", "kept_sets"])
def test_qwen_vocabulary_value_and_gradients_equal_the_full_logits_head(with_kept):
    hidden, weight, bias, targets, upstream = leaves(64, QWEN_VOCAB, 48, scale=0.2)
    kept = kept_sets(targets, QWEN_VOCAB, width=20) if with_kept else None
    assert_same(hidden, weight, targets, upstream, bias=bias, kept_ids=kept, chunk_tokens=20)  # 20 ∤ 48


@pytest.mark.parametrize("chunk_tokens", [1, 5, 7, 37, 64])
@pytest.mark.parametrize("softcap", [None, 4.0])
@pytest.mark.parametrize("head_trains", [True, False], ids=["head_trains", "head_frozen"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_kept_sets_softcap_chunks_and_frozen_head(chunk_tokens, softcap, head_trains, bias):
    hidden, weight, b, targets, upstream = leaves(16, 97, 37, bias=bias, head_trains=head_trains, scale=1.0)
    for kept in (None, kept_sets(targets, 97)):
        assert_same(hidden, weight, targets, upstream, b, kept, softcap, chunk_tokens)


def test_only_the_head_trains():
    hidden, weight, bias, targets, upstream = leaves(16, 97, 30, hidden_trains=False)
    assert_same(hidden, weight, targets, upstream, bias, kept_sets(targets, 97), chunk_tokens=8)


def test_kept_set_semantics_row_by_row():
    """Hand-checked rows: a set renormalizes over its ids; padding, overflow and no set give the full log-prob."""
    vocab = 5
    weight = torch.eye(vocab)
    logits = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])
    hidden = logits.expand(5, vocab).clone()
    targets = torch.tensor([1, 1, 1, 1, 1])
    kept = torch.tensor([[1, 3, -1], [-1, -1, -1], [KEPT_OVERFLOW, 1, 3], [1, 1, 3], [3, 4, -1]])
    out = fused_token_logprobs(hidden, weight, targets, kept_ids=kept, chunk_tokens=2)
    full = 1.0 - torch.logsumexp(logits, 0)
    want = torch.stack(
        [
            1.0 - torch.logsumexp(torch.tensor([1.0, 3.0]), 0),
            full,
            full,
            1.0 - torch.logsumexp(torch.tensor([1.0, 1.0, 3.0]), 0),
            1.0 - torch.logsumexp(torch.tensor([3.0, 4.0]), 0),
        ]
    )
    torch.testing.assert_close(out, want, atol=1e-6, rtol=0)


def test_an_empty_kept_width_is_the_full_distribution_and_no_grad_stores_nothing():
    hidden, weight, bias, targets, _ = leaves(8, 31, 9)
    want = reference(hidden, weight, targets, bias)
    empty = torch.empty(9, 0, dtype=torch.long)
    torch.testing.assert_close(fused_token_logprobs(hidden, weight, targets, bias, empty), want, atol=ATOL, rtol=0)
    with torch.no_grad():
        out = fused_token_logprobs(hidden, weight, targets, bias, chunk_tokens=4)
    assert out.grad_fn is None and not out.requires_grad
    torch.testing.assert_close(out, want.detach(), atol=ATOL, rtol=0)


def test_bf16_autocast_runs_the_matmul_as_the_linear_head_does():
    hidden, weight, bias, targets, upstream = leaves(32, 211, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = reference(hidden, weight, targets, bias)
        fused = fused_token_logprobs(hidden, weight, targets, bias, chunk_tokens=10)
    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused, ref, atol=1e-5, rtol=0)  # the same bf16 logits, then float32
    for got, want in zip(grads(fused, upstream, (hidden, weight, bias)), grads(ref, upstream, (hidden, weight, bias))):
        assert got.dtype == want.dtype == torch.float32
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)  # bf16 matmuls of the same float32 gradient


def test_bad_shapes_are_refused():
    hidden, weight, bias, targets, _ = leaves(8, 31, 9)
    with pytest.raises(ValueError, match="hidden"):
        fused_token_logprobs(hidden[None], weight, targets)
    with pytest.raises(ValueError, match="targets"):
        fused_token_logprobs(hidden, weight, targets[:-1])
    with pytest.raises(ValueError, match="kept_ids"):
        fused_token_logprobs(hidden, weight, targets, kept_ids=targets)
    with pytest.raises(ValueError, match="chunk_tokens"):
        fused_token_logprobs(hidden, weight, targets, chunk_tokens=0)


class LargestTensors(TorchDispatchMode):
    """The largest tensor (elements) any op creates, in the forward and in the backward (ops the autograd engine runs
    for ``backward`` included), and the largest tensor saved for the backward."""

    def __init__(self):
        super().__init__()
        self.phase = "forward"
        self.largest = {"forward": 0, "backward": 0, "saved": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest[self.phase] = max(self.largest[self.phase], t.numel())
        return out

    def pack(self, t):
        self.largest["saved"] = max(self.largest["saved"], t.numel())
        return t

    def run(self, head, upstream):
        with self, torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
            out = head()
            self.phase = "backward"
            (out * upstream).sum().backward()
        return self.largest


@pytest.mark.parametrize("head_trains", [True, False], ids=["head_trains", "head_frozen"])
@pytest.mark.parametrize("with_kept", [False, True], ids=["full", "kept_sets"])
def test_no_tensor_of_all_tokens_by_the_vocabulary(head_trains, with_kept):
    """Op by op (a dispatch mode sees every tensor the forward and the backward create, including inside the
    autograd Function) and in what is saved for the backward: the fused head's largest tensor is one chunk's
    [chunk, V] (or the [V, H] weight gradient), while today's head creates [N, V] ones, so the check can fail."""
    tokens, hidden_dim, vocab, chunk = 256, 8, 4096, 32
    hidden, weight, bias, targets, upstream = leaves(hidden_dim, vocab, tokens, head_trains=head_trains)
    kept = kept_sets(targets, vocab) if with_kept else None
    fused = LargestTensors().run(
        lambda: fused_token_logprobs(hidden, weight, targets, bias, kept, chunk_tokens=chunk), upstream
    )
    bound = max(chunk, hidden_dim) * vocab
    assert 0 < fused["forward"] <= bound and 0 < fused["backward"] <= bound, fused
    assert fused["saved"] <= max(tokens, vocab) * hidden_dim, fused
    assert fused["backward"] >= (chunk * vocab if head_trains else tokens * hidden_dim), fused  # the backward is seen
    ref = LargestTensors().run(lambda: reference(hidden, weight, targets, bias, kept), upstream)
    assert ref["forward"] >= tokens * vocab and ref["backward"] >= tokens * vocab and ref["saved"] >= tokens * vocab


def test_the_head_benchmark_compares_today_and_fused_on_equal_figures(processes, tmp_path):
    """``benchmarks/learner_gpu.py --head`` at a small vocabulary: every variant runs, and those of one head state
    agree on the log-probs and the gradient (the fused head computes what today's does)."""
    import importlib.util
    import json
    import os

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "learner_gpu.py")
    spec = importlib.util.spec_from_file_location("learner_gpu_bench", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "head.json"
    argv = ["--head", "--device", "cpu", "--head-vocab", "2048", "--head-hidden", "32", "--head-rows", "10"]
    bench.main(argv + ["--head-width", "9", "--warmup", "0", "--steps", "1", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["shape"]["tokens"] == 80 and len(report["variants"]) == 6
    for state in ("head_trains", "head_frozen"):
        records = [r for r in report["variants"].values() if r["head_trains"] == (state == "head_trains")]
        assert [r["fused"] for r in records] == [False, True, True] and all("error" not in r for r in records)
        assert records[0]["chunk_tokens"] == 64 and records[2]["chunk_tokens"] == 16
        for r in records:
            assert r["s_per_step"] > 0 and r["peak_extra_mib"] >= 0
            assert abs(r["logp_sum"] - records[0]["logp_sum"]) < 1e-3
            assert abs(r["grad_norm"] - records[0]["grad_norm"]) <= 1e-6 * records[0]["grad_norm"]
        assert report[f"fused_vs_today_{state}"]["grad_norm_rel_diff"] < 1e-6
