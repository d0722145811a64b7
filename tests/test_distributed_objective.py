"""Two real processes (torch.distributed, gloo), each holding half of a batch, against one process holding it all."""

import inspect
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rllib_p3o.core.losses.grpo import grpo_loss
from rllib_p3o.core.losses.p3o import p3o_loss

# Rows 0-3 (rank 0) hold only source 0; rows 4-7 (rank 1) hold sources 0 and 1: the ranks see different sources but
# must still agree on every per-source ESS.
SOURCES = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])


def _p3o_by_source(logp, behavior, adv, mask, rows=slice(None)):
    return p3o_loss(logp, behavior, adv, mask, ess_groups=SOURCES[rows], num_ess_groups=2)


# Another model's rows: rank 0's half only (the policy's own rows are all on rank 1), or every row. Whether they are
# alone in the minibatch is a question about both ranks: rank 0 alone must not take the truncation.
OTHER_ROWS = {"p3o_other_beside": torch.arange(8) < 4, "p3o_other_alone": torch.ones(8, dtype=torch.bool)}


def _p3o_other(name):
    def loss(logp, behavior, adv, mask, rows=slice(None)):
        return p3o_loss(
            logp,
            behavior,
            adv,
            mask,
            other_model_rows=OTHER_ROWS[name][rows],
            other_model_weight="inverse_ess_cap_alone",
        )

    return loss


LOSSES = {
    "p3o": p3o_loss,
    "grpo": grpo_loss,
    "p3o_by_source": _p3o_by_source,
    **{name: _p3o_other(name) for name in OTHER_ROWS},
}


def _full_batch():
    g = torch.Generator().manual_seed(3)
    b, t = 8, 7
    logp = -torch.rand(b, t, generator=g) * 3
    behavior = logp + 0.8 * torch.randn(b, t, generator=g)
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    mask[5] = 0  # a row without valid tokens on one rank
    mask[6, :] = 1  # and unequal token counts per rank
    adv = torch.randn(b, generator=g)
    return logp, behavior, adv, mask


def _run(fn, logp, behavior, adv, mask, rows=slice(None)):
    lp = logp.clone().requires_grad_(True)
    # A parameter shared by every row, as model weights are: its gradient is a sum over rows (and ranks).
    theta = torch.zeros(logp.shape[1], requires_grad=True)
    extra = {"rows": rows} if "rows" in inspect.signature(fn).parameters else {}
    loss, metrics = fn(lp + 0.5 * theta, behavior, adv, mask, **extra)
    loss.backward()
    return loss.detach(), lp.grad, theta.grad, {k: float(v) for k, v in metrics.items()}


def _worker(rank, world, init_file, loss_name, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        logp, behavior, adv, mask = _full_batch()
        rows = slice(rank * 4, rank * 4 + 4)
        loss, grad, theta_grad, metrics = _run(
            LOSSES[loss_name], logp[rows], behavior[rows], adv[rows], mask[rows], rows
        )
        torch.save(
            {"loss": loss, "grad": grad, "theta_grad": theta_grad, "metrics": metrics},
            os.path.join(out_dir, f"rank{rank}.pt"),
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("loss_name", ["p3o", "grpo", "p3o_by_source", *OTHER_ROWS])
def test_two_gloo_processes_match_one_process(loss_name, tmp_path):
    init_file = tempfile.mktemp(dir=tmp_path)
    mp.spawn(_worker, args=(2, init_file, loss_name, str(tmp_path)), nprocs=2, join=True)
    shards = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    loss, grad, theta_grad, metrics = _run(LOSSES[loss_name], *_full_batch())

    # Same ESS (and every other global statistic) on both ranks as on one process.
    for s in shards:
        assert s["metrics"]["ess"] == pytest.approx(metrics["ess"], rel=1e-6)
        assert s["metrics"]["num_tokens"] == metrics["num_tokens"]
        assert s["metrics"]["loss"] == pytest.approx(metrics["loss"], rel=1e-5)
        assert s["metrics"]["ratio_max"] == pytest.approx(metrics["ratio_max"], rel=1e-6)
    assert metrics["ess"] < 0.9  # the batch is off-policy enough for the ESS to matter
    # Shares of the loss sum to the full loss; the summed (= concatenated, per row) gradient is the full gradient.
    torch.testing.assert_close(shards[0]["loss"] + shards[1]["loss"], loss)
    torch.testing.assert_close(torch.cat([shards[0]["grad"], shards[1]["grad"]]), grad)
    torch.testing.assert_close(shards[0]["theta_grad"] + shards[1]["theta_grad"], theta_grad)
    assert theta_grad.abs().sum() > 0


def test_the_weight_alone_differs_beside_the_policys_own_rows():
    # So that the two-process cases above can fail: with the policy's rows present the other rows get the cap, not
    # the truncation they get alone.
    logp, behavior, adv, mask = _full_batch()
    beside = _run(LOSSES["p3o_other_beside"], logp, behavior, adv, mask)[1][:4]
    truncated = _run(
        lambda *a, rows=slice(None): p3o_loss(
            *a, other_model_rows=OTHER_ROWS["p3o_other_beside"], other_model_weight="inverse_ess_cap"
        ),
        logp, behavior, adv, mask,
    )[1][:4]  # fmt: skip
    assert not torch.allclose(beside, truncated)
