"""Ranks on other hosts, watched: a heartbeat over a connection that crosses hosts.

EN heartbeat · RU пульс (heartbeat) · ZH 心跳

A rank on the launcher's machine is watched through the launch's folder and
its abstract Unix socket (:mod:`minipar.launch.rank`).  A rank on another
host sees neither: its ``/tmp`` is its own and an abstract socket exists only
in the launcher's network namespace.  It is not an orphan, it is remote, and
it is watched over TCP, the one thing that crosses hosts:

* **the launcher** (:class:`Heartbeats`, a thread) listens on a port of every
  address of its machine, tells the ranks the port and a secret token
  (:data:`HEARTBEAT_VAR`), and every ``silence / 4`` seconds writes one byte
  to each rank that said the token, and reads theirs.  A connection that ends
  before its rank said ``done`` is a rank that died there (the kernel closes
  it as the process ends, and says so across the network): the launcher names
  it, by rank and host.  A host none of whose ranks was heard for ``silence``
  seconds (:data:`SILENCE_VAR`, default 10) is unreachable (its link is down,
  the machine is gone): :attr:`Heartbeats.lost` names it and since when, and
  the launch is stopped at once rather than at its ``--timeout``;
* **the rank** (:func:`watch`, a thread) finds the launcher's machine where
  MPICH's process manager found it (its proxy's ``--control-port HOST:PORT``;
  else :data:`HOST_VAR`, the launcher's hostname), connects, says who it is,
  beats, and reads the launcher's beats.  When that connection ends (the
  launcher died, even by ``kill -9``: its kernel closes it) or stays silent
  for ``silence`` seconds (the network between them is cut), the rank ends
  itself and its process manager's proxy on that host (:func:`_end_here`):
  no rank outlives its launcher, even where nothing from the launcher can
  reach it.

A launcher killed outright cannot stop mpiexec on its own machine either; a
small guard process does (:data:`GUARD`): it holds a pipe from the launcher
and, when the pipe ends without the word ``done``, kills mpiexec's process
group and removes the launch's folder.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

HEARTBEAT_VAR = "MINIPAR_LAUNCH_HEARTBEAT"  # "PORT TOKEN SILENCE", as the ranks see it
HOST_VAR = "MINIPAR_LAUNCH_HOST"  # the launcher's hostname, where hydra does not say
SILENCE_VAR = "MINIPAR_HEARTBEAT_S"  # seconds of silence after which a side counts as lost
DEFAULT_SILENCE_S = 10.0
BEATS = 4  # beats per silence: a side is lost after missing four
PROXY = "hydra_pmi_proxy"  # MPICH's process manager on each host: a rank's parent
_CONTROL = re.compile(r"^(.+):\d+$")

#: the guard (``python -c GUARD FOLDER``, stdin a pipe from the launcher): mpiexec's process
#: id arrives first; the pipe's end without ``done`` means the launcher died
GUARD = r"""
import os, shutil, signal, sys
said = sys.stdin.read().split()
if "done" not in said:
    for pid in said:
        try:
            os.killpg(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


def silence_s() -> float:
    """:data:`SILENCE_VAR`, or :data:`DEFAULT_SILENCE_S`: ValueError unless a number > 0."""
    text = os.environ.get(SILENCE_VAR, "").strip()
    if not text:
        return DEFAULT_SILENCE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e6:
        raise ValueError(f"{SILENCE_VAR}={text!r}: seconds of silence before a host counts as "
                         "lost, a number > 0 (e.g. 10)")
    return value


# ------------------------------------------------------------------------ the launcher's side
class Heartbeats(threading.Thread):
    """The launcher's side: ``ranks`` (``"host:pid"`` -> ``{pid, rank, size, host, address,
    done, ended}``), ``ended`` (``(monotonic time, key)`` of each connection that ended before
    its rank said done, earliest first) and ``lost`` (the unreachable host, or None);
    ``on_lost`` is called once, from this thread, when a host is lost."""

    def __init__(self, silence: float) -> None:
        super().__init__(daemon=True, name="minipar-heartbeats")
        self.silence = silence
        self.token = secrets.token_hex(8)
        self.listener = socket.create_server(("", 0))  # every address: hosts reach it by theirs
        self.listener.setblocking(False)
        self.ranks: dict[str, dict[str, Any]] = {}
        self.ended: list[tuple[float, str]] = []
        self.lost: dict[str, Any] | None = None
        self.on_lost: Any = None
        self.stop = threading.Event()

    @property
    def value(self) -> str:
        """What the ranks get in :data:`HEARTBEAT_VAR`."""
        return f"{self.listener.getsockname()[1]} {self.token} {self.silence:g}"

    def run(self) -> None:
        # epoll lists the connections in the order their data or their end arrived, however
        # late this thread wakes: the rank that died first is the first end seen
        ep = select.epoll()
        ep.register(self.listener.fileno(), select.EPOLLIN)
        conns: dict[int, list[Any]] = {}  # fd -> [socket, said so far, key, when accepted]
        beat = self.silence / BEATS
        next_beat = 0.0
        while True:
            last = self.stop.is_set()  # mpiexec has ended: one last look, no wait
            events = ep.poll(0 if last else beat / 2)
            now = time.monotonic()
            for fd, _ in events:
                if fd == self.listener.fileno():
                    with contextlib.suppress(BlockingIOError):
                        while True:
                            c, _ = self.listener.accept()
                            c.setblocking(False)
                            conns[c.fileno()] = [c, b"", None, now]
                            ep.register(c.fileno(), select.EPOLLIN)
                elif fd in conns and self._read(fd, conns, now):
                    self._drop(ep, conns, fd)
            for fd, (c, _, key, since) in list(conns.items()):
                if key is None and now - since > self.silence:  # never said the token
                    self._drop(ep, conns, fd)
            if now >= next_beat:
                next_beat = now + beat
                for c, _, key, _ in conns.values():
                    if key is not None:
                        with contextlib.suppress(OSError):  # a full buffer: a cut link
                            c.send(b".", socket.MSG_DONTWAIT)
            if self.lost is None:
                self._check(now)
            if last:
                break
        for c, *_ in conns.values():
            c.close()
        self.listener.close()
        ep.close()

    @staticmethod
    def _drop(ep: Any, conns: dict[int, list[Any]], fd: int) -> None:
        with contextlib.suppress(OSError, ValueError):
            ep.unregister(fd)
        conns.pop(fd)[0].close()

    def _read(self, fd: int, conns: dict[int, list[Any]], now: float) -> bool:
        """Read what connection ``fd`` said; True when it is to be dropped (it ended, or it
        is not one of this launch's ranks)."""
        entry = conns[fd]  # [socket, said so far, key, when accepted]
        c = entry[0]
        try:
            chunk = c.recv(4096)
        except BlockingIOError:
            return False
        except OSError:
            chunk = b""
        if entry[2] is None:  # the first line: TOKEN RANK SIZE PID HOST
            entry[1] += chunk
            if not chunk or b"\n" not in entry[1]:
                return not chunk
            line, rest = entry[1].split(b"\n", 1)
            words = line.decode(errors="replace").split()
            if len(words) != 5 or words[0] != self.token or not all(
                    w.isdigit() for w in words[1:4]):
                return True
            rank, size, pid, host = int(words[1]), int(words[2]), int(words[3]), words[4]
            entry[2] = f"{host}:{pid}"
            address = "?"
            with contextlib.suppress(OSError):
                address = c.getpeername()[0]
            self.ranks[entry[2]] = {"pid": pid, "rank": rank, "size": size, "host": host,
                                    "address": address, "done": False, "ended": False,
                                    "heard": now, "heard_at": time.time()}
            chunk = rest or b"."
        r = self.ranks[entry[2]]
        if not chunk:  # the rank's process has ended (its kernel closed the connection)
            r["ended"] = True
            if not r["done"]:
                self.ended.append((now, entry[2]))
            return True
        r["heard"], r["heard_at"] = now, time.time()
        if b"done" in chunk:
            r["done"] = True
        return False

    def _check(self, now: float) -> None:
        """A host none of whose running ranks was heard for ``silence`` seconds is lost."""
        hosts: dict[str, list[dict[str, Any]]] = {}
        for r in self.ranks.values():
            if not r["ended"] and not r["done"]:
                hosts.setdefault(r["host"], []).append(r)
        for host, ranks in hosts.items():
            heard = max(r["heard"] for r in ranks)
            if now - heard > self.silence:
                self.lost = {"host": host, "address": ranks[0]["address"],
                             "since": max(r["heard_at"] for r in ranks),
                             "ranks": sorted(r["rank"] for r in ranks)}
                if self.on_lost is not None:
                    self.on_lost()
                return


def listen(silence: float) -> Heartbeats | None:
    """The launcher's :class:`Heartbeats`, or None where this machine cannot listen on TCP
    (the remote ranks then run unwatched, as a rank that cannot connect does)."""
    try:
        return Heartbeats(silence)
    except OSError:
        return None


def lost_line(lost: dict[str, Any], silence: float) -> str:
    """The one line of a host cut off: which, since when, and what could not be done."""
    since = time.strftime("%H:%M:%S", time.gmtime(lost["since"]))
    ranks = lost["ranks"]
    which = f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"
    return (f"[minipar] host {lost['host']} ({lost['address']}) unreachable since {since} UTC: "
            f"no heartbeat from its {which} for {silence:g} s; the job was stopped, but "
            f"what runs there could not be killed from here: its {which} end by their own "
            f"watchdog after {silence:g} s without the launcher")


# ---------------------------------------------------------------------------- the rank's side
def launcher_host() -> str | None:
    """Where this rank reaches the launcher's machine: the address MPICH's proxy (our parent)
    was told to reach mpiexec at (``--control-port HOST:PORT``), else :data:`HOST_VAR`."""
    try:
        argv = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
        i = argv.index(b"--control-port")
        if m := _CONTROL.match(argv[i + 1].decode()):
            return m.group(1)
    except (OSError, ValueError, IndexError):
        pass
    return os.environ.get(HOST_VAR) or None


def high_fd() -> int:
    """The highest file descriptor this process may use (at most 4095): a dying process
    closes its files from the highest down, so a connection there tells of the end first."""
    import resource

    return min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 4096) - 1


def watch(rank: int, size: int) -> bool:
    """Rank side: connect to the launcher, say who this rank is, and start the thread that
    beats and watches (:func:`_beat`); False when there is no launcher to watch."""
    value, host = os.environ.get(HEARTBEAT_VAR, "").split(), launcher_host()
    if len(value) != 3 or host is None:
        return False
    port, token, silence = int(value[0]), value[1], float(value[2])
    try:
        s = socket.create_connection((host, port), timeout=silence)
        me = socket.gethostname()
        s.sendall(f"{token} {rank} {size} {os.getpid()} {me}\n".encode())
    except OSError:  # unreachable from here: this rank runs unwatched, as before
        return False
    # on a high descriptor: the launcher hears of this rank's end before its peers do (they
    # see its MPI connections close, fail, and may crash in their turn: not the cause)
    high = os.dup2(s.fileno(), high_fd() - 1, inheritable=False)
    s.close()
    s = socket.socket(fileno=high)
    s.setblocking(False)
    atexit.register(_done, s)
    threading.Thread(target=_beat, args=(s, silence, f"rank {rank} of {size} on {me}"),
                     daemon=True, name="minipar-heartbeat").start()
    return True


def _done(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.send(b"done\n", socket.MSG_DONTWAIT)


def _beat(s: socket.socket, silence: float, who: str) -> None:
    """Beat every ``silence / 4`` s; end this host's part when the launcher's end closes or
    stays silent for ``silence`` s."""
    beat = silence / BEATS
    heard = next_beat = time.monotonic()
    poller = select.poll()  # not select(): the descriptor is above FD_SETSIZE
    poller.register(s.fileno(), select.POLLIN)
    while True:
        ready = poller.poll(beat / 2 * 1000)
        now = time.monotonic()
        if ready:
            try:
                chunk = s.recv(4096)
            except BlockingIOError:
                chunk = b"."
            except OSError:
                chunk = b""
            if not chunk:
                return _end_here(who, "the launcher's connection ended (it is gone)")
            heard = now
        elif now - heard > silence:
            return _end_here(who, f"no heartbeat from the launcher for {silence:g} s")
        if now >= next_beat:
            next_beat = now + beat
            with contextlib.suppress(OSError):
                s.send(b".", socket.MSG_DONTWAIT)


def _end_here(who: str, why: str) -> None:
    """The launcher is lost: end this rank and MPICH's proxy that started it on this host."""
    with contextlib.suppress(OSError):
        os.write(2, f"[minipar] {who}: {why}; ending this rank and its proxy\n".encode())
    parent = os.getppid()
    try:
        is_proxy = Path(f"/proc/{parent}/comm").read_text().strip() == PROXY
    except OSError:
        is_proxy = False
    if is_proxy:
        with contextlib.suppress(OSError):
            os.kill(parent, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def start_guard(folder: str) -> Any:
    """The guard of a launch whose ranks may all be remote (:data:`GUARD`)."""
    import subprocess

    return subprocess.Popen([sys.executable, "-I", "-S", "-c", GUARD, folder],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, text=True)
