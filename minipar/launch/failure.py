"""Why a launch failed, in one line, and what it must not leave behind.

EN failure report · RU отчёт о сбое · ZH 故障报告

When one rank fails, MPI ends the job and prints a wall of messages from
every survivor.  A learner needs one sentence: which rank, and what happened.
:func:`describe` finds it, in this order:

1. a rank raised: the ``[minipar] rank R of N failed: Type: message`` line
   (:func:`minipar.comm.install_excepthook`);
2. a rank ended the job itself: MPICH's ``Abort(code) ... (rank R in comm 0)``
   (for 1 and 2, when the job was killed before that output was forwarded,
   the rank's own record says it: :func:`minipar.launch.rank.main` notes the
   status or the failure line before ``MPI_Abort`` is called);
3. a rank was killed by a signal (SIGKILL: the kernel's out-of-memory killer,
   or ``kill -9``): MPICH says "BAD TERMINATION ... Killed (signal 9)", but the
   process id it names is whichever rank it looked at first, often a survivor
   it killed itself.  :class:`ExitOrder` records the order in which this
   machine's ranks ended (each holds a socket to the launcher that the kernel
   closes as the process dies), so the rank named is the first to end without
   finishing normally (one that finished writes ``PID.done``,
   :mod:`minipar.launch.rank`).  This comes before 1 and 2 when that rank is
   not the one that raised or aborted: a survivor whose message was in flight
   to the dead rank gets an MPI error ("Other MPI error ... process_vm_readv
   failed") before the process manager ends it, and raises in its turn, but the
   kill is the cause;
   A rank on another host is ordered the same way, by the end of its heartbeat
   connection (:mod:`minipar.launch.heartbeat`); there MPICH names whichever
   process it looked at first, so when MPICH says a process ended badly the
   first to end is named, with its host, whatever MPICH's words;
4. a rank ended early without an error message (``os._exit(3)``, a crash in C
   code that MPI does not report): the first rank to end without finishing,
   from the same exit order, with mpiexec's exit status;
5. otherwise MPI itself failed, most often before any rank ran (a host that
   does not resolve, a wrong option in ``MINIPAR_MPIEXEC_ARGS``): the line of
   mpiexec's error output that states the cause.  MPICH prints its call stack
   innermost first, ``[mpiexec@host] match_arg (.../args.c:166): unrecognized
   argument bogus`` up to ``[mpiexec@host] main (.../mpiexec.c:49): error
   parsing parameters``; a line that is not such a stack line (``ssh: Could
   not resolve hostname nosuchhost``) is the cause, else the innermost stack
   line is.  The outermost, last line ("process manager error waiting for
   completion") is the least useful one.

The notes the ranks write (:func:`records`) also list MPICH's hardware-map
files (``/tmp/hydra_hwloc_xmlfile_*``, a fixed path its process manager
cannot remove when the job is aborted); :func:`clean` deletes them with the
launch's private folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

LAUNCH_DIR_VAR = "MINIPAR_LAUNCH_DIR"  # the launch's private folder, as the ranks see it
RANKS_DIR = ".ranks"
SOCKET_NAME = "ranks.sock"  # each rank connects as it starts (see ExitOrder)
SOCKET_VAR = "MINIPAR_LAUNCH_SOCKET"  # its address, as the ranks see it
HWLOC_PREFIX = "/tmp/hydra_hwloc_xmlfile_"  # fixed in MPICH's hydra_pmi_proxy
MPIEXEC_PID = "mpiexec.pid"  # the launcher notes mpiexec's process id here (its group's id)

_RAISED = re.compile(r"^\[minipar\] rank (\d+) of \d+ failed: .*$", re.MULTILINE)
_ABORT = re.compile(r"Abort\((\d+)\) on node \d+ \(rank (\d+) in comm 0\)")
_KILLED = re.compile(r"PID (\d+) RUNNING AT (\S+).*?(?:signal (\d+)|SIGNAL: (\d+))", re.DOTALL)
_BAD = re.compile(r"BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES")
#: one line of MPICH's call stack: ``[mpiexec@host] function (file.c:LINE): message``
_MPICH_STACK = re.compile(r"^\[[^\]]+\] \S+ \([^()]*:\d+\): (.*)$")


def records(folder: str) -> dict[int, dict[str, Any]]:
    """What each rank on this machine noted: {pid: {pid, rank, size, host, hwloc, done}}."""
    out = {}
    for f in Path(folder, RANKS_DIR).glob("*.json"):
        try:
            r = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        r["done"] = f.with_suffix(".done").exists()
        out[r["pid"]] = r
    return out


class ExitOrder(threading.Thread):
    """The order in which this machine's ranks let go of the launch: ``order``, a list of
    pids, earliest first.

    Each rank connects to the launcher's Unix socket as it starts
    (:func:`minipar.launch.rank.note`) and never closes it: the kernel closes
    it as the process ends, and epoll lists the closed connections in the
    order the closes happened, however late this thread wakes.  A rank killed
    by a signal closes its files before its process manager can notice and
    kill the others, so it comes first.
    """

    def __init__(self, folder: str) -> None:
        super().__init__(daemon=True, name="minipar-exit-order")
        self.order: list[int] = []
        self.at: list[float] = []  # when each end was seen (time.monotonic())
        self.stop = threading.Event()
        self.address = socket_address(folder)
        self.listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(sockaddr(self.address))
            self.listener.listen(1024)
            self.listener.setblocking(False)
        except OSError:  # e.g. a folder path too long for a socket: no order, MPICH's word
            self.listener.close()
            self.listener = None

    def run(self) -> None:
        if self.listener is None:
            return
        ep = select.epoll() if hasattr(select, "epoll") else None  # Linux: ordered events
        poller = ep or select.poll()
        poller.register(self.listener.fileno(), select.POLLIN)
        conns: dict[int, tuple[socket.socket, bytearray]] = {}
        while True:
            last = self.stop.is_set()  # mpiexec has ended, and every rank with it: one last
            for fd, _ in poller.poll(0 if last else (0.25 if ep else 250)):  # look, no wait
                if fd == self.listener.fileno():
                    self._accept(poller, conns)
                else:
                    self._read(poller, conns, fd)
            if last:
                break
        for c, _ in conns.values():
            c.close()
        self.listener.close()
        if ep:
            ep.close()

    def _accept(self, poller: Any, conns: dict[int, tuple[socket.socket, bytearray]]) -> None:
        assert self.listener is not None
        with contextlib.suppress(BlockingIOError):
            while True:
                c, _ = self.listener.accept()
                c.setblocking(False)
                conns[c.fileno()] = (c, bytearray())
                poller.register(c.fileno(), select.POLLIN)

    def _read(self, poller: Any, conns: dict[int, tuple[socket.socket, bytearray]],
              fd: int) -> None:
        c, said = conns[fd]
        try:
            while chunk := c.recv(64):
                said += chunk
        except BlockingIOError:
            return  # the rank said its pid and is still running
        poller.unregister(fd)  # recv gave b"": the rank's process has ended
        c.close()
        del conns[fd]
        if said.strip().isdigit():
            self.order.append(int(said))
            self.at.append(time.monotonic())


def socket_address(folder: str) -> str:
    """Where the ranks of the launch in ``folder`` connect: on Linux ``@NAME``, a name in the
    abstract namespace (no file, no length limit from the folder's path), elsewhere a file
    in the folder.  :func:`sockaddr` turns it into what ``bind``/``connect`` take."""
    if sys.platform.startswith("linux"):
        return "@" + os.path.basename(folder)  # mkdtemp's name: unique while it exists
    return os.path.join(folder, SOCKET_NAME)


def sockaddr(address: str) -> str:
    """``@NAME`` -> ``\\0NAME`` (the abstract namespace); a path stays a path."""
    return "\0" + address[1:] if address.startswith("@") else address


def clean(folder: str) -> None:
    """Delete MPICH's hardware-map files noted by this launch's ranks, then the folder."""
    host = socket.gethostname()
    for r in records(folder).values():
        for f in r.get("hwloc", []):
            if r.get("host") == host and f.startswith(HWLOC_PREFIX):
                Path(f).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


def describe(code: int, stdout: str, stderr: str, ranks: dict[int, dict[str, Any]],
             order: list[int] | None = None) -> str:
    """One line: which rank failed and how, or why MPI could not start them.

    ``code``: mpiexec's exit status; ``stdout``, ``stderr``: the launch's
    output; ``ranks``: :func:`records`; ``order``: :attr:`ExitOrder.order`."""
    output = stdout + "\n" + stderr
    first = next((p for p in order or [] if p in ranks and not ranks[p]["done"]), None)
    killed = _KILLED.search(output)
    # on another host (its record came by heartbeat): its end is known, not how (MPICH
    # names whichever process it looked at first there, and its words vary)
    remote = first is not None and "address" in ranks[first]
    # the rank that ended first, killed by a signal (on another host: MPICH saw a process
    # end badly, which MPI_Abort alone does not print): a survivor's error came after it
    bad = killed or (remote and _BAD.search(output))
    dead = ranks[first].get("rank") if bad and first is not None else None
    if m := _RAISED.search(output):
        raised: tuple[int, str] | None = (int(m.group(1)), m.group(0))
    else:  # the line was lost as the job was killed: the rank's own record has it
        raised = next(((r["rank"], r["raised"]) for r in ranks.values() if r.get("raised")), None)
    if raised and dead in (None, raised[0]):
        return raised[1]
    if m := _ABORT.search(output):
        aborted: tuple[int, int] | None = (int(m.group(2)), int(m.group(1)))
    else:
        aborted = next(((r["rank"], r["aborted"]) for r in ranks.values() if r.get("aborted")),
                       None)
    if aborted and dead in (None, aborted[0]):
        return (f"[minipar] rank {aborted[0]} ended the job with exit status {aborted[1]} "
                "(MPI_Abort)")
    if remote and bad:
        r = ranks[first]
        return (f"[minipar] {_who(r)} (pid {r['pid']} on {r.get('host')}) ended first, before "
                "finishing and without an error message: killed (kill -9, the kernel's OOM "
                "killer), crashed or exited early")
    if m := killed:
        pid, host, sig = int(m.group(1)), m.group(2), int(m.group(3) or m.group(4))
        # the first rank to end without finishing: MPICH killed the others after it
        if first is not None:  # its record: on another host, its own host and pid there
            pid, host = ranks[first]["pid"], ranks[first].get("host") or host
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "unknown signal"
        why = (": out of memory (the kernel's OOM killer sends SIGKILL) or killed from outside"
               if sig == signal.SIGKILL else "")
        who = _who(ranks.get(first) if first is not None else ranks.get(pid))
        return (f"[minipar] {who} (pid {pid} on {host}) was killed by signal "
                f"{sig} ({name}){why}")
    if code < 0:
        return f"[minipar] mpiexec was killed by signal {-code}"
    if first is not None and not remote:  # remote, no bad termination: MPI's own error
        r = ranks[first]
        return (f"[minipar] {_who(r)} (pid {r['pid']} on {r.get('host')}) ended before finishing, "
                f"with no error message (mpiexec exit status {code})")
    what = "the ranks failed" if ranks else "mpiexec failed"
    cause = cause_line(stderr)
    return f"[minipar] {what} (exit {code})" + (f": {cause}" if cause else "")


def _who(r: dict[str, Any] | None) -> str:
    return f"rank {r['rank']} of {r['size']}" if r and r.get("rank") is not None else "a rank"


def cause_line(stderr: str) -> str:
    """The line of mpiexec's error output that states why it failed ('' if none).

    The first line that is not one of MPICH's stack lines (and has a word in
    it: not a ``=====`` rule), else the message of the first, innermost stack
    line (``unrecognized argument bogus``)."""
    lines = [ln.strip() for ln in stderr.splitlines() if re.search(r"[A-Za-z]", ln)]
    other = next((ln for ln in lines if not _MPICH_STACK.match(ln)), None)
    if other is not None:
        return other
    return next((m.group(1) for ln in lines if (m := _MPICH_STACK.match(ln))), "")
