import pytest

from minipar.overlap import hidden_fraction, merge, overlap, total


def test_merge_joins_touching_and_nested_intervals():
    assert merge([(3, 4), (0, 1), (0.5, 2), (1.5, 1.8), (5, 5)]) == [(0, 2), (3, 4)]
    assert total([(0, 1), (0.5, 2), (3, 4)]) == 3.0


def test_merge_refuses_a_backwards_interval():
    with pytest.raises(ValueError, match="ends before it starts"):
        merge([(2, 1)])


def test_overlap_counts_common_time_once():
    assert overlap([(0, 10)], [(1, 2), (1.5, 3), (9, 12)]) == pytest.approx(3.0)
    assert overlap([(0, 1)], [(1, 2)]) == 0.0


@pytest.mark.parametrize("compute, comm, want", [
    ([(0, 10)], [(2, 4)], 1.0),            # all hidden
    ([(0, 1)], [(2, 4)], 0.0),             # none hidden
    ([(0, 3)], [(2, 4), (2.5, 3.5)], 0.5),  # two messages in flight at once count once
    ([(0, 1), (3, 5)], [(0.5, 3.5)], 1 / 3),
])
def test_hidden_fraction(compute, comm, want):
    assert hidden_fraction(compute, comm) == pytest.approx(want)


def test_hidden_fraction_without_communication_is_none():
    assert hidden_fraction([(0, 1)], []) is None
