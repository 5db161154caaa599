"""Progress of a launch (``minipar.progress.watched``): rank 0 ticks a file, the launcher's bar
follows it; a launch that fails at once prints no bar before its one line."""

from __future__ import annotations

import io
import os
import time

import pytest

from minipar import progress


def test_the_bar_follows_the_ticks_and_the_file_is_removed() -> None:
    s = io.StringIO()
    with progress.watched(3, "unit", s, delay=0.0) as path:
        assert os.path.getsize(path) == 0
        progress.tick(path)
        deadline = time.monotonic() + 60  # an upper bound, never a pace: the event is the draw
        while "unit 1/3 [" not in s.getvalue():  # the polling thread draws 1/3
            assert time.monotonic() < deadline, s.getvalue()
            time.sleep(progress.POLL_S / 4)
        progress.tick(path, 2)
    lines = s.getvalue().splitlines()
    assert lines[0].startswith("unit 0/3 [....") and "unit 1/3 [" in s.getvalue()
    assert lines[-1].startswith("unit 3/3 [" + "#" * 30 + "]")
    assert not os.path.exists(path)
    progress.tick(None)  # no file given: nothing to do, no error
    progress.tick(path)  # a file this rank cannot reach: progress is only shown, no error
    assert not os.path.exists(path)  # and a tick never creates it

def test_a_launch_that_fails_at_once_draws_nothing() -> None:
    s = io.StringIO()
    with (pytest.raises(RuntimeError, match="mpiexec missing"),
          progress.watched(5, "size", s) as path):  # the default delay, 1 s
        raise RuntimeError("mpiexec missing")
    assert s.getvalue() == "" and not os.path.exists(path)
