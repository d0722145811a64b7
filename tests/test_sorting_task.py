"""The claims bench's sorting task (pure Python, no model): the verifier, the held-out split and the slips of the
base model's pretraining corpus."""

import random

from rllib_p3o.tasks.sorting import SortingTask, sorting_reward


def test_the_verifier_wants_exactly_the_sorted_list():
    assert sorting_reward(
        None, ["1,3,4,7,9", " 1,3,4,7,9<eos>", "1,3,4,7,9,9", "1,4,3,7,9", "13479"], ["1,3,4,7,9"] * 5
    ) == [
        1.0,
        1.0,
        0.0,
        0.0,
        0.0,
    ]


def test_held_out_lists_never_reach_training_or_pretraining():
    task = SortingTask(num_rows=2000, num_heldout=100)
    heldout = {r["prompt"] for r in task.heldout_rows()}
    train = {r["prompt"] for r in task.train_rows()}
    assert len(heldout) == 100 and not heldout & train and len(train) == 1900
    corpus = task.pretraining_corpus()
    assert not any(line.startswith(p) for line in corpus for p in list(heldout)[:20])
    lengths = [len(r["answer"].split(",")) for r in task.train_rows()]
    assert min(lengths) == 4 and max(lengths) == 7


def test_a_slip_is_never_the_right_answer():
    rng = random.Random(0)
    for _ in range(2000):
        digits = [rng.randrange(10) for _ in range(rng.randint(4, 7))]
        assert SortingTask.slip(digits, rng) != SortingTask.answer(digits)
