import pytest

from minipar.overlap import Pair, handoff, hidden_fraction, merge, minus, overlap, total


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


def test_minus_cuts_the_waits_out_of_the_computing():
    assert minus([(0, 10)], [(2, 3), (5, 6), (9, 12)]) == [(0, 2), (3, 5), (6, 9)]
    assert minus([(0, 1), (4, 5)], [(0.5, 4.5)]) == [(0, 0.5), (4.5, 5)]


def test_a_pair_takes_turns_at_each_handoff_and_raises_the_first_error():
    """DualPipe's F&B: the forward runs until it starts a message, the backward until it
    starts one, and so on; a half that never hands over runs as a plain call."""
    seen = []

    def forward():
        for i in range(3):
            seen.append(f"F{i}")
            handoff()

    def backward():
        for i in range(2):
            seen.append(f"B{i}")
            handoff()

    pair = Pair(forward, backward)
    pair.run()
    assert seen == ["F0", "B0", "F1", "B1", "F2"] and pair.interleaved
    assert all(s >= 0 for s in pair.seconds + pair.cpu)
    seen.clear()
    alone = Pair(lambda: seen.append("F"), backward)
    alone.run()
    assert seen == ["F", "B0", "B1"] and not alone.interleaved
    handoff()  # outside a pair: nothing

    def failing():
        handoff()
        raise ValueError("the backward failed")

    with pytest.raises(ValueError, match="the backward failed"):
        Pair(forward, failing).run()
