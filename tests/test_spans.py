"""The one partitioning rule (minipar.spans) is numpy.array_split's."""

import numpy as np
import pytest

from minipar import spans


@pytest.mark.parametrize("parts", range(1, 9))
def test_counts_offsets_and_span_follow_array_split(parts: int) -> None:
    for n in range(40):
        expected = [len(a) for a in np.array_split(np.arange(n), parts)]
        assert spans.counts(n, parts) == expected
        starts = spans.offsets(expected)
        for i in range(parts):
            assert spans.span(n, parts, i) == (starts[i], starts[i] + expected[i])


@pytest.mark.parametrize("args", [(5, 0, 0), (5, -1, 0), (-1, 2, 0), (5, 2, 2), (5, 2, -1)])
def test_bad_arguments_are_rejected(args: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        spans.span(*args)
