"""A trial file's row (`rllib_p3o.sweep.report.result_row`) from one Tune result: the diagnostics columns read from
where the learner reports them. Pure: results are written by hand, no Ray."""

import math

import pytest

from rllib_p3o.core import metrics
from rllib_p3o.sweep import report


def _result(**learner):
    return {"training_iteration": 3, metrics.LEARNER[0]: {metrics.LEARNER[1]: learner}}


@pytest.mark.parametrize(
    "mask",
    [
        metrics.TRUST_MASKED_FRACTION,
        metrics.M2_MASKED_FRACTION,
        metrics.BEHAVIOR_MASKED_FRACTION,
        metrics.SEQ_MASKED_FRACTION,  # grpo_seq_mask's dropped sequences
    ],
)
def test_masked_fraction_is_the_mask_the_loss_reports(mask):
    row = report.result_row(_result(**{mask: 0.25, metrics.CLIP_FRACTION: 0.5}))
    assert row[report.ITERATION] == 3
    assert row[report.MASKED_FRACTION] == 0.25
    assert row[report.CLIP_FRACTION] == 0.5


def test_a_loss_without_a_mask_has_no_masked_fraction():
    row = report.result_row(_result(**{metrics.CLIP_FRACTION: 0.5}))
    assert math.isnan(row[report.MASKED_FRACTION])
