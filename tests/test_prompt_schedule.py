"""The driver's prompt schedule (pure Python): epochs are permutations, the position is independent of how groups
are split, given-back groups come first, and a restored schedule continues exactly where the saved one stood."""

from rllib_p3o.data.prompt_schedule import PromptSchedule, group_seed


def test_each_epoch_visits_every_row_once_in_a_seeded_order():
    s = PromptSchedule(num_rows=7, seed=1)
    first, second = [g.row for g in s.take(7)], [g.row for g in s.take(7)]
    assert sorted(first) == sorted(second) == list(range(7))
    assert first != second  # reshuffled every epoch
    assert [g.row for g in PromptSchedule(num_rows=7, seed=1).take(7)] == first
    assert [g.row for g in PromptSchedule(num_rows=7, seed=2).take(7)] != first


def test_order_does_not_depend_on_how_groups_are_taken():
    one = PromptSchedule(num_rows=5, seed=0).take(12)
    s = PromptSchedule(num_rows=5, seed=0)
    assert s.take(3) + s.take(4) + s.take(5) == one
    assert group_seed(0, 7) == group_seed(0, 7) != group_seed(1, 7)


def test_given_back_groups_come_first_and_nothing_is_skipped_or_repeated():
    s = PromptSchedule(num_rows=100)
    a = s.take(4)
    s.done(g.group_id for g in a[:2])
    assert s.give_back(g.group_id for g in a) == 2  # only the two not trained on
    again = s.take(3)
    assert [g.group_id for g in again] == [2, 3, 4] and again[:2] == a[2:]


def test_restored_schedule_continues_exactly_with_pending_groups_first():
    s = PromptSchedule(num_rows=9, seed=4)
    s.done(g.group_id for g in s.take(5))
    in_flight = s.take(3)  # e.g. async samples not yet trained at checkpoint time
    state = s.get_state()
    assert state == {"next_group": 8, "pending": [5, 6, 7]}
    uninterrupted = s.take(0) or [g for g in in_flight] + s.take(4)

    restored = PromptSchedule(num_rows=9, seed=4)
    restored.set_state(state)
    assert restored.take(7) == uninterrupted
