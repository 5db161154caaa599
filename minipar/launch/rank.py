"""What every rank runs first: ``python -m mpi4py -m minipar.launch.rank TARGET ARGS``.

EN rank bootstrap · RU запуск на ранге · ZH 进程端引导

TARGET is ``-m MODULE`` or ``SCRIPT.py``.  Before the target runs, the rank
notes in the launch's private folder (``$MINIPAR_LAUNCH_DIR/.ranks/``, only
on the launching machine) who it is:
its rank (from the process manager's environment: Hydra's ``PMI_RANK``,
Open MPI's ``OMPI_COMM_WORLD_RANK``, Slurm's ``SLURM_PROCID``), its process
id and host, and it connects to the launcher's socket, which stays open until
the process ends (:class:`minipar.launch.failure.ExitOrder`).  After ``MPI_Init`` it adds the hardware-map file MPICH's
process manager holds open (``/tmp/hydra_hwloc_xmlfile_*``, a fixed path that
an aborted job leaves behind), and at a normal exit it writes ``PID.done``.
With these notes the launcher deletes what MPI left and names the rank that
died first (:mod:`minipar.launch.failure`).

**No rank outlives its launcher** (:func:`watch_launcher`).  mpiexec runs in
a session of its own (so that Ctrl-C reaches the launcher, which stops the
ranks in order), and so a launcher killed with ``kill -9``, or crashing,
would leave mpiexec, its hydra proxy and every rank running under init for
good, its folder in the temp folder.  The launcher's end of the rank's
connection is closed by the kernel as the launcher dies, whatever killed it;
a thread of the rank waits on that connection and, at its end, forks a
reaper in a session of its own: it kills mpiexec's process group (mpiexec and
the hydra proxy: the group id is mpiexec's process id, which the launcher
noted) and every rank noted in the folder (Hydra gives each rank a session of
its own), waits until none runs and removes the launch's folder.  A signal
to the parent alone would not do (``PR_SET_PDEATHSIG`` fires when the
*parent* dies, and a rank's parent is the proxy).

A rank that does not see the launch's folder runs on another host: it is
watched over the network instead (:func:`minipar.launch.heartbeat.watch`).

Then the target runs as ``__main__``, exactly as ``python -m mpi4py`` would
run it (an exception still ends the whole job through ``MPI_Abort``); an
exception first installs :func:`minipar.comm.install_excepthook`, whose
``[minipar] rank R of N failed: ...`` line the launcher reports.

**Whole lines.**  Every rank writes into a pipe that MPI's process manager
reads and forwards; what it reads from N ranks lands in one stream in the
order it was read.  Unbuffered, ``print("rank", r, grid)`` is several
``write`` calls and the lines of different ranks mix mid-line; so the rank's
stdout and stderr are made line-buffered (:func:`whole_lines`): a printed
line is one ``write``, forwarded whole.  Nothing printed is lost when a rank
fails: the interpreter flushes its streams as it exits, before mpi4py's
exit handler calls ``MPI_Abort`` (tests/test_launch.py checks it with a line
left without its newline).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from minipar.host_memory import keep_freed_memory
from minipar.launch import heartbeat
from minipar.launch.failure import (
    HWLOC_PREFIX,
    LAUNCH_DIR_VAR,
    MPIEXEC_PID,
    RANKS_DIR,
    SOCKET_VAR,
    clean,
    records,
    sockaddr,
)

#: (rank, size) environment variables of the process managers minipar may run under
RANK_VARS = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
             ("PMIX_RANK", "PMIX_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"))
_HELD: list[int] = []  # the connection to the launcher, a descriptor never closed by hand
REAP_WAIT_S = 5.0  # how long the reaper waits for the killed group to be gone before cleaning


def _write(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)  # whole or absent: the launcher never reads half a record


def note(folder: str) -> tuple[Path, dict]:
    """Write this rank's record before MPI starts, complete it after, mark a normal exit;
    return the record's path and contents (:func:`main` adds how the rank ended)."""
    ranks = Path(folder, RANKS_DIR)
    ranks.mkdir(exist_ok=True)
    pid = os.getpid()
    rank, size = next(((int(os.environ[r]), int(os.environ.get(s, "0"))) for r, s in RANK_VARS
                       if os.environ.get(r, "").isdigit()), (None, None))
    record = {"pid": pid, "rank": rank, "size": size, "host": socket.gethostname(), "hwloc": []}
    path = ranks / f"{pid}.json"
    try:  # held open until this process ends: the kernel's close tells the launcher when
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(sockaddr(os.environ[SOCKET_VAR]))
            s.sendall(f"{pid}\n".encode())
            # on a high descriptor: a dying process releases its files from the highest
            # descriptor down, so the launcher hears of the end before the process
            # manager does (through the PMI socket or stdout), who then kills the others
            _HELD.append(os.dup2(s.fileno(), heartbeat.high_fd(), inheritable=False))
    except KeyError:  # the launcher has no socket: no watcher, only the order of ends is lost
        pass
    except OSError:  # the launcher listens while it lives: refused, it is already gone
        end_launch(folder)
    else:
        threading.Thread(target=watch_launcher, args=(_HELD[-1], folder), daemon=True,
                         name="minipar-launcher-watch").start()
    _write(path, record)  # after the watcher starts: a rank whose note exists is watched
    from mpi4py import MPI  # MPI_Init: the process manager writes its hardware map now

    record["rank"], record["size"] = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    try:  # the file is held open by our parent, MPICH's hydra_pmi_proxy
        fds = Path(f"/proc/{os.getppid()}/fd").iterdir()
        record["hwloc"] = sorted({t for t in map(os.readlink, fds) if t.startswith(HWLOC_PREFIX)})
    except OSError:  # no /proc (macOS), or another process manager
        pass
    _write(path, record)
    atexit.register(_done, ranks / f"{pid}.done")
    return path, record


def watch_launcher(fd: int, folder: str) -> None:
    """Wait until the launcher's end of the connection on ``fd`` closes, then end the launch.

    The launcher never writes on it and closes it only after mpiexec has ended
    (:class:`minipar.launch.failure.ExitOrder`), so while a rank runs, the end
    of this stream means the launcher is gone: :func:`end_launch`."""
    try:
        while os.read(fd, 4096):  # blocks; b"" (or a reset) once the launcher's end is closed
            pass
    except OSError:
        pass
    end_launch(folder)


def end_launch(folder: str) -> None:
    """The launcher is gone: fork a reaper (:func:`_reap`) and wait for it to end us all."""
    try:
        if os.fork() == 0:
            _reap(os.getppid(), folder)
    except OSError:  # no reaper: this rank goes alone, its process manager ends the others
        clean(folder)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(REAP_WAIT_S)  # the reaper kills this process; if it could not, end anyway
    os.kill(os.getpid(), signal.SIGKILL)


def _reap(rank: int, folder: str) -> None:
    """The reaper, a child of ``rank`` forked in a session of its own: it kills mpiexec's
    process group (mpiexec and its hydra proxy: their group id is mpiexec's process id,
    which the launcher noted) and every rank the folder lists (Hydra starts each rank in
    a session of its own, so no one group holds them), waits until none is left running,
    then removes ``folder`` and MPICH's hardware maps its ranks noted.  Every rank forks
    one; they do the same work, and the first to see all gone cleans.  Never returns."""
    try:
        os.setsid()
        try:
            group = int(Path(folder, MPIEXEC_PID).read_text())
        except (OSError, ValueError):
            group = None
        deadline = time.monotonic() + REAP_WAIT_S
        while time.monotonic() < deadline:
            pids = set(records(folder)) | {rank}
            if group is not None:
                with contextlib.suppress(OSError):
                    os.killpg(group, signal.SIGKILL)
                pids.add(group)
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if not any(map(_running, pids)):
                break
            time.sleep(0.02)
        clean(folder)
    finally:
        os._exit(0)


def _running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie, ended but not yet waited for, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _done(mark: Path) -> None:
    with contextlib.suppress(OSError):  # the launcher may have removed its folder already
        mark.touch()


def whole_lines() -> None:
    """Line-buffer stdout and stderr, whatever ``PYTHONUNBUFFERED`` says: one line, one write."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):  # replaced by a non-text stream
            stream.reconfigure(line_buffering=True, write_through=False)


def main(argv: list[str]) -> None:
    whole_lines()
    keep_freed_memory()  # every step reuses the memory of the last (minipar.host_memory)
    folder = os.environ.get(LAUNCH_DIR_VAR, "")
    noted = note(folder) if folder and os.path.isdir(folder) else None  # the launching machine
    if noted is None:  # another host: watched over the network (minipar.launch.heartbeat)
        rank, size = next(((int(os.environ[r]), int(os.environ.get(s, "0"))) for r, s in RANK_VARS
                           if os.environ.get(r, "").isdigit()), (-1, 0))
        heartbeat.watch(rank, size)
    try:
        if argv[0] == "-m":
            sys.argv[:] = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv[:] = argv
            sys.path[0] = os.path.realpath(os.path.dirname(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:  # python -m mpi4py turns a non-zero status into MPI_Abort(status)
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if status and noted:
            _ended(*noted, aborted=status)
        raise
    except Exception as e:  # the "[minipar] rank R of N failed: ..." line above the traceback
        from minipar.comm import install_excepthook
        from minipar.comm.errors import failed_line

        if noted:
            _ended(*noted, raised=failed_line(e))
        install_excepthook()
        raise


def _ended(path: Path, record: dict, **how: object) -> None:
    """Add to the rank's record how it is about to end the job (``aborted``: the status it
    passes to MPI_Abort; ``raised``: its failure line), before MPI_Abort is called.  MPICH
    prints its own ``Abort(status) ... (rank R in comm 0)`` line too, but on a busy machine
    the process manager may kill the job before it has forwarded the rank's last output:
    the launcher then reads the record."""
    with contextlib.suppress(OSError):  # the launcher may have removed its folder already
        _write(path, {**record, **how})


if __name__ == "__main__":
    main(sys.argv[1:])
