"""Start N MPI ranks: the one way minipar launches anything — запуск рангов — 启动进程.

    >>> from minipar import launch
    >>> proc = launch.run(2, "path/to/script.py", timeout=30)        # a script
    >>> result, proc = launch.run_json(4, "minipar.cli.demo", {"elems": 1000})  # a module

What it does, and why:

* It uses the ``mpiexec`` of *this* Python environment (the ``mpich`` wheel
  installs one next to ``python``), so no system MPI is needed, it works as
  root and with more ranks than cores.  ``MINIPAR_MPIEXEC`` names another one
  (a cluster's own ``mpiexec``, or a wrapper such as ``srun``), and
  ``MINIPAR_MPIEXEC_ARGS`` adds options for it; ``hostfile=`` passes
  ``-hostfile FILE`` through, so the same command spans machines.
* It runs ``python -m mpi4py -m minipar.launch.rank TARGET``.  With
  ``-m mpi4py`` an unhandled exception on one rank calls ``MPI_Abort`` and
  ends the whole job (without it the other ranks would wait forever);
  :mod:`minipar.launch.rank` notes the rank's number and process id in the
  launch's folder, then runs TARGET (a module or a script) as ``__main__``.
* It sets one BLAS/OpenMP thread per rank: eight ranks on two cores each
  spawning their own BLAS thread pool would only fight for the cores.  Each
  rank's output is line-buffered (:mod:`minipar.launch.rank`): a printed line
  is one ``write``, so lines of different ranks never mix mid-line.
* It enforces a wall-clock ``timeout`` (> 0 and at most 1e6 s,
  :data:`minipar.cli.options.MAX_SECONDS`): on expiry (or Ctrl-C, or SIGTERM)
  mpiexec is asked to stop (SIGTERM, which it forwards to every rank), then the
  whole process group is killed, and :class:`LaunchTimeout` (or
  ``KeyboardInterrupt``; :class:`~minipar.cli.options.Terminated` for SIGTERM)
  is raised.  SIGHUP (the terminal was closed) is handled as SIGTERM.  A test
  that launches ranks can therefore never hang, and a launcher stopped by
  ``kill``, ``timeout`` or a scheduler leaves no rank behind.
* **The launcher owns its ranks.**  Even a launcher that cannot clean up
  (``kill -9``, a crash) leaves nothing running: each rank on this machine
  holds a connection to the launcher, and the kernel closes the launcher's end
  as it dies; the rank's watcher thread sees the end of that stream and ends
  mpiexec's whole process group (mpiexec, its hydra proxy, every rank), then
  removes the launch's folder (:func:`minipar.launch.rank.watch_launcher`).
* **Ranks on other hosts are watched too** (:mod:`minipar.launch.heartbeat`):
  with ``hostfile`` (or ``MINIPAR_MPIEXEC``) each rank that cannot see the
  launch's folder beats over a TCP connection to the launcher.  A rank that
  died there is named with its host; a host silent for ``MINIPAR_HEARTBEAT_S``
  seconds (default 10) is named and the launch stopped then, its ranks ending
  by their own watchdog; a launcher killed outright ends them at once, and a
  guard process ends mpiexec and removes the folder.
* **A launch leaves nothing behind.**  It gets a private temporary folder
  (``TMPDIR`` of mpiexec and of the ranks), removed afterwards whatever
  happened.  MPICH's process manager writes its hardware map to the fixed path
  ``/tmp/hydra_hwloc_xmlfile_*`` and cannot delete it when the job aborts;
  each rank notes that file and the launcher deletes it
  (:func:`minipar.launch.failure.clean`).
* **A failure is one line** (:attr:`Launched.failure`,
  :func:`minipar.launch.failure.describe`): the ``[minipar] rank R of N
  failed: ...`` line of a rank that raised, or ``rank R ... was killed by
  signal 9 (SIGKILL)`` for a rank that died (the kernel's out-of-memory killer
  sends SIGKILL), instead of MPI's stacks; when MPI itself could not start
  (an unknown host, a wrong option in ``MINIPAR_MPIEXEC_ARGS``), the line
  that says why.  Every error of a launch is a :class:`LaunchError`, and
  :func:`report` turns any of them into that one line for a command.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from minipar.cli.options import check_seconds, one_line, sigterm_as_interrupt
from minipar.launch import failure, heartbeat
from minipar.launch.failure import LAUNCH_DIR_VAR

#: environment variables that control BLAS / OpenMP thread pools
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "BLIS_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
DEFAULT_TIMEOUT = 120.0
MPIEXEC_VAR, MPIEXEC_ARGS_VAR = "MINIPAR_MPIEXEC", "MINIPAR_MPIEXEC_ARGS"
#: rank 0 of a :func:`run_json` target prints its result on one line after this
RESULT_PREFIX = "MINIPAR_RESULT "
WORKER_FLAG = "--worker"
STOP_GRACE_S = 3.0  # seconds mpiexec gets to stop its ranks before they are killed


class LaunchError(RuntimeError):
    """A launch went wrong: mpiexec could not be found or started (:data:`MPIEXEC_VAR`
    names no program), the ranks did not finish in time (:class:`LaunchTimeout`), or
    (``check``) they failed (:class:`RanksFailed`).  ``except LaunchError`` catches all."""


class LaunchTimeout(LaunchError):
    """The ranks did not finish within the timeout; all were killed."""

    def __init__(self, cmd: list[str], timeout: float, stdout: str, stderr: str):
        self.cmd, self.timeout, self.stdout, self.stderr = cmd, timeout, stdout, stderr
        tail = (stdout[-2000:] + "\n" + stderr[-2000:]).strip()
        super().__init__(f"{' '.join(cmd)!r} did not finish within {timeout:g} s and was "
                         f"killed (all ranks).\n--- last output ---\n{tail}")


class RanksFailed(LaunchError):
    """A :func:`run_json` launch whose ranks failed or printed no result (``check=True``);
    ``str()`` is the one line of :attr:`Launched.failure`, ``proc`` the launch."""

    def __init__(self, message: str, proc: Launched):
        super().__init__(message)
        self.proc = proc


class Launched(subprocess.CompletedProcess):
    """A finished launch: ``returncode``, ``stdout``, ``stderr`` and ``failure``, one line
    saying which rank failed and how (None when every rank exited with 0)."""

    failure: str | None = None


def find_mpiexec() -> str:
    """Path of the ``mpiexec`` belonging to the running Python environment."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found:
        return found
    raise LaunchError("mpiexec not found next to this Python nor on PATH; "
                      "`pip install mpich` provides one (it is a dependency of minipar)")


def _split_var(name: str) -> list[str]:
    """The words of environment variable ``name``, split as a shell would."""
    text = os.environ.get(name, "")
    try:
        return shlex.split(text)
    except ValueError as e:  # e.g. an unclosed quote
        raise LaunchError(f"{name}={text!r} cannot be split into words: {e}") from None


def mpiexec_command() -> list[str]:
    """``$MINIPAR_MPIEXEC $MINIPAR_MPIEXEC_ARGS``, or this environment's ``mpiexec``."""
    cmd = _split_var(MPIEXEC_VAR) or [find_mpiexec()]
    return cmd + _split_var(MPIEXEC_ARGS_VAR)


def rank_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment every rank gets: one BLAS thread per rank, this minipar importable."""
    env = dict(os.environ)
    env.pop(failure.SOCKET_VAR, None)  # a launch from a rank: its ranks watch this launcher
    env.pop(heartbeat.HEARTBEAT_VAR, None)
    env.update(dict.fromkeys(THREAD_VARS, "1"))
    # ranks must import the same minipar as the launcher, even from a checkout
    pkg_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def command(n: int, target: str, *args: str, prepend_rank: bool = False,
            hostfile: str | os.PathLike[str] | None = None) -> list[str]:
    """The full ``mpiexec -n N python -m mpi4py -m minipar.launch.rank TARGET ...`` command."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"number of ranks must be a positive integer, got {n!r}")
    cmd = mpiexec_command()
    if hostfile is not None:
        if not Path(hostfile).is_file():
            raise ValueError(f"--hostfile {hostfile}: no such file")
        cmd += ["-hostfile", str(hostfile)]
    cmd += ["-n", str(n)] + (["-prepend-rank"] if prepend_rank else [])
    cmd += [sys.executable, "-m", "mpi4py", "-m", "minipar.launch.rank"]
    is_script = target.endswith(".py") or os.sep in target or Path(target).is_file()
    cmd += [target] if is_script else ["-m", target]
    return cmd + [str(a) for a in args]


def run(n: int, target: str, *args: str, timeout: float = DEFAULT_TIMEOUT,
        env: dict[str, str] | None = None, capture: bool = True, check: bool = False,
        prepend_rank: bool = False, cwd: str | os.PathLike[str] | None = None,
        hostfile: str | os.PathLike[str] | None = None) -> Launched:
    """Run ``target`` (a module name or a ``.py`` path) on ``n`` ranks.

    Returns the finished launch (``returncode``, ``stdout``, ``stderr`` — None
    when ``capture`` is False — and ``failure``).  Raises ``ValueError`` for a
    bad ``n``, ``hostfile`` or ``timeout`` (seconds, > 0 and at most 1e6),
    :class:`LaunchError` when mpiexec cannot be started, :class:`LaunchTimeout`
    past ``timeout`` seconds, ``subprocess.CalledProcessError`` on a non-zero
    exit when ``check`` is true, and re-raises ``KeyboardInterrupt`` (Ctrl-C,
    or :class:`~minipar.cli.options.Terminated`: while the ranks run, SIGTERM
    raises it unless the program handles SIGTERM itself) after stopping every
    rank.  The private folder is removed in every case.
    """
    check_seconds("timeout", timeout)
    cmd = command(n, target, *args, prepend_rank=prepend_rank, hostfile=hostfile)
    remote = hostfile is not None or bool(os.environ.get(MPIEXEC_VAR, "").strip())
    try:
        silence = heartbeat.silence_s() if remote else 0.0
    except ValueError as e:
        raise LaunchError(str(e)) from None
    with sigterm_as_interrupt():  # `kill`, `timeout`, a scheduler: stop the ranks as Ctrl-C does
        folder = tempfile.mkdtemp(prefix="minipar-launch-")
        order = failure.ExitOrder(folder)
        beats = heartbeat.listen(silence) if remote else None  # ranks on other hosts
        guard = heartbeat.start_guard(folder) if remote else None  # mpiexec, if we are killed
        try:
            order.start()  # waits for the ranks to connect
            rank_vars = {**(env or {}), "TMPDIR": folder, LAUNCH_DIR_VAR: folder}
            if order.listener is not None:  # the ranks watch the launcher through it
                rank_vars[failure.SOCKET_VAR] = order.address
            if beats is not None:
                beats.start()
                rank_vars[heartbeat.HEARTBEAT_VAR] = beats.value
                rank_vars[heartbeat.HOST_VAR] = socket.gethostname()
            proc = _start(cmd, rank_env(rank_vars), capture, cwd)
            note_mpiexec(folder, proc.pid)
            if guard is not None:
                _tell(guard, f"{proc.pid}\n")
            if beats is not None:  # a host lost: stop the launch now, not at its timeout
                beats.on_lost = lambda: threading.Thread(target=_stop, args=(proc,),
                                                         daemon=True).start()
            result = _wait(proc, cmd, timeout)
            if result.returncode:
                order.stop.set()
                order.join()  # every end the ranks' sockets reported
                ranks: dict[Any, dict[str, Any]] = dict(failure.records(folder))
                ended: list[Any] = list(order.order)
                if beats is not None:  # the ends seen here and on other hosts, earliest first
                    beats.stop.set()
                    beats.join()
                    ranks.update(beats.ranks)
                    seen = [*zip(order.at, order.order), *beats.ended]
                    ended = [k for _, k in sorted(seen, key=lambda e: e[0])]
                if beats is not None and beats.lost is not None:
                    result.failure = heartbeat.lost_line(beats.lost, silence)
                else:
                    result.failure = failure.describe(result.returncode, result.stdout or "",
                                                      result.stderr or "", ranks, ended)
        finally:
            order.stop.set()
            if beats is not None:
                beats.stop.set()
            if guard is not None:
                _tell(guard, "done\n")
                guard.stdin.close()
                guard.wait()
            failure.clean(folder)
    if check and result.returncode != 0:
        raise subprocess.CalledProcessError(result.returncode, cmd, result.stdout, result.stderr)
    return result


def _tell(guard: subprocess.Popen[str], words: str) -> None:
    with contextlib.suppress(OSError):  # a guard already gone has nothing left to do
        guard.stdin.write(words)
        guard.stdin.flush()


def _start(cmd: list[str], env: dict[str, str], capture: bool,
           cwd: str | os.PathLike[str] | None) -> subprocess.Popen[str]:
    """Start mpiexec in a session of its own: one process group holds it and every rank."""
    pipe = subprocess.PIPE if capture else None
    try:
        return subprocess.Popen(cmd, stdout=pipe, stderr=pipe, stdin=subprocess.DEVNULL,
                                text=True, cwd=cwd, env=env, start_new_session=True)
    except OSError as e:
        if os.environ.get(MPIEXEC_VAR, "").strip():
            raise LaunchError(f"cannot start {cmd[0]!r}, named by {MPIEXEC_VAR}: "
                              f"{e.strerror or e}; set {MPIEXEC_VAR} to an mpiexec, or unset "
                              "it to use this environment's own") from None
        raise LaunchError(f"cannot start {cmd[0]!r}: {e.strerror or e}") from None


def note_mpiexec(folder: str, pid: int) -> None:
    """Note mpiexec's process id in the launch's folder: it is also the id of the process
    group of mpiexec, its proxies and the ranks, which the ranks end if the launcher dies
    (:func:`minipar.launch.rank.watch_launcher`)."""
    path = Path(folder, failure.MPIEXEC_PID)
    path.with_suffix(".tmp").write_text(str(pid))
    path.with_suffix(".tmp").replace(path)  # whole or absent


def _wait(proc: subprocess.Popen[str], cmd: list[str], timeout: float) -> Launched:
    """Wait for the launch to end; stop every rank on a timeout or any exception."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        out, err = proc.communicate()
        raise LaunchTimeout(cmd, timeout, out or "", err or "") from None
    except BaseException:  # Ctrl-C or SIGTERM: no rank left running, then the caller decides
        _stop(proc)
        proc.communicate()
        raise
    return Launched(cmd, proc.returncode, out, err)


def run_json(n: int, module: str, payload: Any, *, timeout: float = DEFAULT_TIMEOUT,
             prefix: str = RESULT_PREFIX, check: bool = False,
             **kwargs: Any) -> tuple[Any, Launched]:
    """Run ``python -m MODULE --worker JSON`` on ``n`` ranks; ``(result, launch)``.

    ``result`` is the JSON value after ``prefix`` on the last such line of the
    output (the one rank 0 printed through :func:`serve`), None if there is
    none.  With ``check``, a failed launch or a missing result raises
    :class:`RanksFailed` whose message is :attr:`Launched.failure`.  Other
    keyword arguments go to :func:`run`."""
    proc = run(n, module, WORKER_FLAG, json.dumps(payload), timeout=timeout, **kwargs)
    found = [ln for ln in (proc.stdout or "").splitlines() if ln.startswith(prefix)]
    result = json.loads(found[-1][len(prefix):]) if found else None
    if check and (proc.returncode != 0 or not found):
        why = proc.failure or f"python -m {module} on {n} ranks printed no result"
        raise RanksFailed(why, proc)
    return result, proc


def report(prog: str, err: LaunchError, debug: bool = False) -> int:
    """Tell a command-line user that a launch failed, in one line; return exit status 1.

    Any :class:`LaunchError`: the ranks failed (:attr:`Launched.failure`), ran
    past the timeout, or mpiexec could not be started (``PROG: why``).  With
    ``debug`` every rank's output comes first (tracebacks, MPI's messages)."""
    if isinstance(err, LaunchTimeout):
        output = err.stdout + err.stderr
        line = (f"{prog}: the ranks did not finish within --timeout {err.timeout:g} s and "
                "were all killed")
    elif isinstance(err, RanksFailed):
        output, line = (err.proc.stdout or "") + (err.proc.stderr or ""), str(err)
    else:  # nothing ran, so there is no output to show
        print(f"{prog}: {one_line(str(err))}", file=sys.stderr)
        return 1
    if debug:
        sys.stderr.write(output)
    print(line if debug else f"{line} (--debug shows every rank's output)", file=sys.stderr)
    return 1


def is_worker(argv: list[str]) -> bool:
    """True when ``argv`` is what :func:`run_json` gives a rank: ``--worker JSON``."""
    return len(argv) == 2 and argv[0] == WORKER_FLAG


def serve(fn: Callable[[Any], Any], argv: list[str], prefix: str = RESULT_PREFIX) -> int:
    """Rank side of :func:`run_json`: ``fn(payload)``; a result that is not None is
    printed as one ``prefix + JSON`` line (return None on every rank but one)."""
    result = fn(json.loads(argv[1]))
    if result is not None:
        print(prefix + json.dumps(result), flush=True)
    return 0


# ------------------------------------------------------------------ stopping a launch
def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to mpiexec (it forwards it and cleans up), then SIGKILL to whatever is left."""
    try:
        proc.send_signal(signal.SIGTERM)
        proc.wait(STOP_GRACE_S)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
