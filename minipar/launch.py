"""Start N MPI ranks: the one way minipar launches anything.

    >>> from minipar import launch
    >>> proc = launch.run(4, "minipar.demo", "--inner")      # a module (-m)
    >>> proc = launch.run(2, "path/to/script.py", timeout=30)  # a script

What it does, and why:

* It uses the ``mpiexec`` of *this* Python environment (the ``mpich`` wheel
  installs one next to ``python``), so no system MPI is needed, it works as
  root and with more ranks than cores.
* It runs ``python -m mpi4py TARGET``.  Without ``-m mpi4py`` an unhandled
  exception on one rank leaves the other ranks blocked forever; with it the
  failing rank calls ``MPI_Abort`` and MPICH ends the whole job, printing
  ``Abort(1) on node R (rank R in comm 0)``.
* It sets one BLAS/OpenMP thread per rank: eight ranks on two cores each
  spawning their own BLAS thread pool would only fight for the cores.
* It enforces a wall-clock ``timeout``: on expiry the whole process group
  (mpiexec and every rank) is killed and :class:`LaunchTimeout` is raised with
  whatever the ranks printed.  A test that launches ranks can therefore never
  hang.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

#: environment variables that control BLAS / OpenMP thread pools
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)

DEFAULT_TIMEOUT = 120.0


class LaunchError(RuntimeError):
    """mpiexec could not be found or the launch itself was invalid."""


class LaunchTimeout(RuntimeError):
    """The ranks did not finish within the timeout; all were killed."""

    def __init__(self, cmd: list[str], timeout: float, stdout: str, stderr: str):
        self.cmd, self.timeout, self.stdout, self.stderr = cmd, timeout, stdout, stderr
        tail = (stdout[-2000:] + "\n" + stderr[-2000:]).strip()
        super().__init__(
            f"{' '.join(cmd)!r} did not finish within {timeout:g} s and was killed "
            f"(all ranks).\n--- last output ---\n{tail}"
        )


def find_mpiexec() -> str:
    """Path of the ``mpiexec`` belonging to the running Python environment."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise LaunchError(
        "mpiexec not found next to this Python nor on PATH; "
        "`pip install mpich` provides one (it is a dependency of minipar)"
    )


def rank_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every rank gets: one BLAS thread, unbuffered output."""
    env = dict(os.environ)
    for var in THREAD_VARS:
        env[var] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    # ranks must import the same minipar as the launcher, even from a checkout
    pkg_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (pkg_root, env.get("PYTHONPATH", "")) if p
    )
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def command(n: int, target: str, *args: str, prepend_rank: bool = False) -> list[str]:
    """The full ``mpiexec -n N python -m mpi4py ...`` command line."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"number of ranks must be a positive integer, got {n!r}")
    cmd = [find_mpiexec(), "-n", str(n)]
    if prepend_rank:
        cmd.append("-prepend-rank")
    cmd += [sys.executable, "-m", "mpi4py"]
    is_script = target.endswith(".py") or os.sep in target or Path(target).is_file()
    cmd += [target] if is_script else ["-m", target]
    return cmd + [str(a) for a in args]


def run(
    n: int,
    target: str,
    *args: str,
    timeout: float = DEFAULT_TIMEOUT,
    env: dict[str, str] | None = None,
    capture: bool = True,
    check: bool = False,
    prepend_rank: bool = False,
    cwd: str | os.PathLike[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``target`` (a module name or a ``.py`` path) on ``n`` ranks.

    Returns the completed process (``returncode``, ``stdout``, ``stderr``;
    the latter two are None when ``capture`` is False).  Raises
    :class:`LaunchTimeout` past ``timeout`` seconds, after killing every
    rank, and ``subprocess.CalledProcessError`` on a non-zero exit when
    ``check`` is true.
    """
    cmd = command(n, target, *args, prepend_rank=prepend_rank)
    pipe = subprocess.PIPE if capture else None
    proc = subprocess.Popen(
        cmd,
        stdout=pipe,
        stderr=pipe,
        stdin=subprocess.DEVNULL,
        env=rank_env(env),
        text=True,
        cwd=cwd,
        start_new_session=True,  # one process group: mpiexec and all ranks
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise LaunchTimeout(cmd, timeout, out or "", err or "") from None
    except BaseException:
        _kill_group(proc)
        proc.wait()
        raise
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check and result.returncode != 0:
        raise subprocess.CalledProcessError(result.returncode, cmd, out, err)
    return result


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
