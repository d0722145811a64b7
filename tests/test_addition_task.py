"""The claims bench's second task, addition with the carries written out (pure Python, no model): the verifier, the
column trace and its slips, the held-out split and the pretraining corpus. Every expected value is worked by hand."""

import random

from rllib_p3o.tasks.addition import AdditionTask, addition_reward, columns


def test_the_verifier_checks_only_the_sum_after_the_first_colon_exactly():
    completions = [
        "7+6=13,4+8+1=13,3+5+1=9:933",  # right trace, right sum
        "7+6=13,4+8=12,3+5+1=9:933",  # a carry dropped in the trace, the sum still right: counts
        "7+6=13,4+8+1=13,3+5+1=9:923",  # right trace, a miscopied sum: does not
        "7+6=13,4+8+1=13,3+5+1=9:9330",  # an extra digit
        "7+6=13,4+8+1=13,3+5+1=9 933",  # no colon
        "7+6=13,4+8+1=13,3+5+1=9: 933<eos>",  # a space and the end token after the number are fine
        "x:93:933",  # the first colon's number counts, not a later one
    ]
    assert addition_reward(None, completions, ["933"] * len(completions)) == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0]


def test_the_trace_adds_column_by_column_from_the_units_with_the_carries():
    assert columns(347, 586, 3) == (["7+6=13", "4+8+1=13", "3+5+1=9"], 933)
    assert columns(999, 1, 3) == (["9+1=10", "9+0+1=10", "9+0+1=10"], 1000)  # the last carry becomes a fourth digit
    assert AdditionTask().completion(347, 586) == "7+6=13,4+8+1=13,3+5+1=9:933"


def test_a_slip_changes_the_columns_after_it_as_a_sloppy_adder_would():
    # a dropped carry into the tens: 4+8=12 (not 13), then 3+5+1=9, so the sum is 923
    assert columns(347, 586, 3, slip=(1, "drop")) == (["7+6=13", "4+8=12", "3+5+1=9"], 923)
    # the units column one too high: 7+6=14, its carry still follows from 14
    assert columns(347, 586, 3, slip=(0, "off")) == (["7+6=14", "4+8+1=13", "3+5+1=9"], 934)
    # one too high in the units digit only: 9 wraps to 0 with no carry out, so 5+4 is written 0
    assert columns(125, 134, 3, slip=(0, "off")) == (["5+4=0", "2+3=5", "1+1=2"], 250)
    task, rng = AdditionTask(), random.Random(0)
    for _ in range(500):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        assert not task.slip(a, b, rng).endswith(f":{a + b}")


def test_held_out_sums_never_reach_training_or_pretraining():
    task = AdditionTask(num_rows=2000, num_heldout=100)
    heldout = {r["prompt"] for r in task.heldout_rows()}
    train = {r["prompt"] for r in task.train_rows()}
    assert len(heldout) == 100 and len(train) == 1900 and not heldout & train
    assert all(r["answer"] == str(sum(AdditionTask.operands(r["prompt"]))) for r in task.train_rows()[:50])
    corpus = task.pretraining_corpus(format_fraction=1.0, correct_fraction=0.5)
    formatted = [line for line in corpus if line.startswith("add:")]
    assert len(formatted) == 1900 and not any(line[: line.index("=") + 1] in heldout for line in formatted)
    right = sum(line.endswith(":" + str(sum(AdditionTask.operands(line[: line.index("=") + 1])))) for line in formatted)
    assert right == 950  # correct_fraction of the formatted lines, the others carry one slip
