"""A cluster of network namespaces on one machine (issue 38): many machines, tried on one.

``Cluster(hosts=2, slots=2)`` makes, as root, with ``ip netns``:

* a *login* namespace holding a bridge, ``br0`` (:data:`ADDRESS`.1): the launcher,
  ``minipar``, runs there, outside the hosts, as on a cluster's login node;
* K *host* namespaces ``h1 .. hK``, each joined to the bridge by a veth pair (``eth0``
  inside, :data:`ADDRESS`.1N), the bridge's end named after the host (``h2``): cutting
  a host off is ``ip link set h2 down`` on the login side;
* a stand-in for ``ssh`` (``mpiexec -launcher ssh -launcher-exec CMD``), called as ssh is
  (options such as ``-x``, the host, then the proxy's command): it skips the options and
  runs the proxy under ``ip netns exec NS unshare --uts --ipc --mount --pid --fork
  --mount-proc`` with a private tmpfs on ``/tmp`` and the host's own hostname, so each host
  has what a second machine has of its own (network, hostname, processes, ``/tmp``) while
  the working folder (:attr:`Cluster.shared`, outside ``/tmp``) stays shared, as a
  cluster's home folder is;
* a host file (``10.254.38.11:2`` per host) and the environment that makes minipar's
  launcher use all this (``MINIPAR_MPIEXEC_ARGS="-launcher ssh -launcher-exec CMD -iface
  br0"``).

Every address lives inside namespaces made here, so nothing on the machine's own
network changes; :meth:`Cluster.close` kills whatever still runs in them, deletes them
(their links go with them) and the shared folder, and :meth:`Cluster.leftovers` says what
is left.  :func:`refusal` is the one-line reason a machine cannot host the cluster (not
root, no ``ip``/``unshare``, namespaces refused): the tests are skipped with it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUBNET = "10.254.38"  # inside the cluster's own namespaces only
ADDRESS = SUBNET + ".{}"
BRIDGE = "br0"
#: where the shared folder goes: a home folder's stand-in, never under the hosts' /tmp
SHARED_BASE = "/var/tmp"

SSH = """#!{python}
# minipar's simulated cluster: stands in for ssh (options, HOST, then the command)
import os, sys
HOSTS = {hosts!r}  # address or name -> (namespace, hostname)
args = sys.argv[1:]
while args and args[0].startswith("-"):  # ssh's options (hydra passes -x)
    args.pop(0)
host, command = args[0], " ".join(args[1:])
if host not in HOSTS:
    sys.exit(f"ssh: Could not resolve hostname {{host}}")
ns, name = HOSTS[host]
# nothing of mpiexec's crosses to the host but the command (ssh passes no descriptor):
# mpiexec's sockets held open there would keep its proxies waiting for ever
os.closerange(3, 1 << 16)
os.execvp("ip", ["ip", "netns", "exec", ns, "unshare", "--uts", "--ipc", "--mount", "--pid",
                 "--fork", "--mount-proc", "sh", "-c",
                 'hostname "$1" && ' + {private_tmp!r} + ' && exec sh -c "$2"', "sh", name,
                 command])
"""


def private_tmp(keep: list[str]) -> str:
    """The shell line that gives a host its own empty /tmp, the paths of ``keep`` (this
    checkout and its interpreter, when they live under /tmp, as a fresh CI clone may) bound
    back into it at the same place: a cluster's hosts share the home folder that holds the
    installation; only the rest of /tmp is each host's own.  The old /tmp is reached through
    /mnt, a mount point of the host's private mount namespace only."""
    if not keep:
        return "mount -t tmpfs tmpfs /tmp"
    back = " && ".join(f"mkdir -p {shlex.quote(p)} && mount --bind "
                       f"{shlex.quote('/mnt' + p[len('/tmp'):])} {shlex.quote(p)}" for p in keep)
    return f"mount --bind /tmp /mnt && mount -t tmpfs tmpfs /tmp && {back}"


def under_tmp() -> list[str]:
    """This checkout and the interpreter's prefix, where they live under /tmp (outermost
    first, each once)."""
    root = os.path.realpath(Path(__file__).resolve().parents[1])
    found = sorted({p for p in (root, os.path.realpath(sys.prefix))
                    if p.startswith("/tmp/")})
    return [p for p in found if not any(p.startswith(q + "/") for q in found if q != p)]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check,
                          stdin=subprocess.DEVNULL, timeout=30)


def refusal() -> str | None:
    """Why this machine cannot host a simulated cluster, in one line; None if it can."""
    if not sys.platform.startswith("linux"):
        return "a simulated cluster needs Linux network namespaces"
    if os.geteuid() != 0:
        return "a simulated cluster needs root (ip netns add)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"a simulated cluster needs `{tool}` (iproute2, util-linux)"
    if not os.path.isdir(SHARED_BASE) or os.path.realpath(SHARED_BASE).startswith("/tmp"):
        return f"a simulated cluster needs {SHARED_BASE} outside /tmp (its shared folder)"
    name = f"mpprobe{os.getpid()}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode:
        return f"this machine refuses network namespaces: {made.stderr.strip()}"
    try:
        probe = subprocess.run(
            ["ip", "netns", "exec", name, "unshare", "--uts", "--ipc", "--mount", "--pid",
             "--fork", "--mount-proc", "sh", "-c", "mount -t tmpfs tmpfs /tmp && hostname x"],
            capture_output=True, text=True, timeout=30, check=False)
        if probe.returncode:
            return f"this machine refuses the hosts' namespaces: {probe.stderr.strip()}"
        bridge = _ip("-n", name, "link", "add", BRIDGE, "type", "bridge", check=False)
        if bridge.returncode:
            return f"this machine refuses a bridge: {bridge.stderr.strip()}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


class Cluster:
    """K hosts of ``slots`` ranks each, a login namespace, a host file: see the module."""

    def __init__(self, hosts: int = 2, slots: int = 2) -> None:
        self.prefix = f"mp{os.getpid()}"
        self.login = f"{self.prefix}-login"
        self.names = [f"h{i + 1}" for i in range(hosts)]
        self.addresses = {h: ADDRESS.format(11 + i) for i, h in enumerate(self.names)}
        self.namespaces = {h: f"{self.prefix}-{h}" for h in self.names}
        self.shared = Path(tempfile.mkdtemp(prefix="minipar-cluster-", dir=SHARED_BASE))
        try:
            self._make(slots)
        except BaseException:
            self.close()
            raise

    def _make(self, slots: int) -> None:
        _ip("netns", "add", self.login)
        _ip("-n", self.login, "link", "set", "lo", "up")
        _ip("-n", self.login, "link", "add", BRIDGE, "type", "bridge")
        _ip("-n", self.login, "addr", "add", ADDRESS.format(1) + "/24", "dev", BRIDGE)
        _ip("-n", self.login, "link", "set", BRIDGE, "up")
        for h in self.names:
            ns = self.namespaces[h]
            _ip("netns", "add", ns)
            _ip("-n", self.login, "link", "add", h, "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", self.login, "link", "set", h, "master", BRIDGE, "up")
            _ip("-n", ns, "addr", "add", self.addresses[h] + "/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        hosts = {k: (self.namespaces[h], h) for h in self.names for k in (h, self.addresses[h])}
        self.ssh = self.shared / "ssh"
        self.ssh.write_text(SSH.format(python=sys.executable, hosts=hosts,
                                       private_tmp=private_tmp(under_tmp())))
        self.ssh.chmod(0o755)
        self.hostfile = self.shared / "hosts"
        self.hostfile.write_text("".join(f"{self.addresses[h]}:{slots}\n" for h in self.names))

    # -- running ------------------------------------------------------------------------
    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """This process's environment, with the launcher told to use the cluster."""
        args = f"-launcher ssh -launcher-exec {self.ssh} -iface {BRIDGE}"
        return {**os.environ, "MINIPAR_MPIEXEC_ARGS": args, **(extra or {})}

    def command(self, *argv: str) -> list[str]:
        """``python -m minipar.cli ARGV`` as run on the login namespace."""
        return ["ip", "netns", "exec", self.login, sys.executable, "-m", "minipar.cli", *argv]

    def minipar(self, *argv: str, env: dict[str, str] | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``minipar ARGV`` on the login namespace, in the shared folder, to its end."""
        return subprocess.run(self.command(*argv), capture_output=True, text=True,
                              cwd=self.shared, env=self.env(env), timeout=timeout,
                              stdin=subprocess.DEVNULL, check=False)

    def python(self, code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run ``python -c CODE`` on the login namespace, in the shared folder."""
        return subprocess.run(["ip", "netns", "exec", self.login, sys.executable, "-c", code],
                              capture_output=True, text=True, cwd=self.shared, env=self.env(),
                              timeout=timeout, stdin=subprocess.DEVNULL, check=False)

    def start(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """Start ``minipar ARGV`` on the login namespace (its pid is minipar's own:
        ``ip netns exec`` execs it)."""
        return subprocess.Popen(self.command(*argv), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=self.shared,
                                env=self.env(env), stdin=subprocess.DEVNULL)

    # -- looking at the hosts -----------------------------------------------------------
    def pids(self, host: str) -> list[int]:
        """Every process running on ``host`` (in its network namespace), zombies aside."""
        out = _ip("netns", "pids", self.namespaces[host], check=False).stdout.split()
        return [int(p) for p in out if running(int(p))]

    def ranks(self, host: str) -> list[int]:
        """The processes of ``host`` that are Python (its ranks), as this machine numbers them."""
        return [p for p in self.pids(host) if _comm(p).startswith("python")]

    def cut(self, host: str) -> None:
        """Cut ``host`` off: its link to the bridge goes down (nothing reaches it)."""
        _ip("-n", self.login, "link", "set", host, "down")

    def restore(self, host: str) -> None:
        """Bring ``host``'s link back; forget what both sides learned while it was down (a
        neighbour that did not answer is "No route to host" for a while otherwise)."""
        _ip("-n", self.login, "link", "set", host, "up")
        for ns in (self.login, self.namespaces[host]):
            _ip("-n", ns, "neigh", "flush", "all")

    def leftovers(self) -> dict[str, list[int]]:
        """What still runs on each host, by host (empty lists: nothing)."""
        return {h: self.pids(h) for h in self.names}

    def wait_empty(self, deadline_s: float) -> bool:
        """Wait (polling, bounded by ``deadline_s``) until no process runs on any host."""
        end = time.monotonic() + deadline_s
        while any(self.leftovers().values()):
            if time.monotonic() > end:
                return False
            time.sleep(0.05)
        return True

    def close(self) -> None:
        """Kill whatever runs on the hosts, delete every namespace and the shared folder."""
        for ns in [*self.namespaces.values(), self.login]:
            for _ in range(100):
                pids = _ip("netns", "pids", ns, check=False).stdout.split()
                if not pids:
                    break
                for p in pids:
                    with contextlib.suppress(OSError):
                        os.kill(int(p), signal.SIGKILL)
                time.sleep(0.02)
            _ip("netns", "del", ns, check=False)
        shutil.rmtree(self.shared, ignore_errors=True)

    def gone(self) -> list[str]:
        """What :meth:`close` failed to remove (namespaces, the shared folder): [] if all."""
        listed = _ip("netns", "list", check=False).stdout
        left = [ln.split()[0] for ln in listed.splitlines() if ln.startswith(self.prefix + "-")]
        return left + ([str(self.shared)] if self.shared.exists() else [])


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
