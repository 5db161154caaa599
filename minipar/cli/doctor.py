"""``minipar doctor``: what this machine gives minipar, one line each, and what to fix.

EN environment check · RU проверка окружения · ZH 环境检查

The lines: Python, NumPy, mpi4py, the MPI library (the first line of
``MPI.Get_library_version()``), the array backend (``MINIPAR_BACKEND`` and
what :mod:`minipar.backend` loaded), CuPy, the device, whether the MPI is
CUDA-aware, whether freed host memory is kept for reuse
(:mod:`minipar.host_memory`), and what to fix.  ``--json`` prints the same as JSON.

CUDA-aware MPI (it reads and writes device memory itself, so a GPU buffer
goes to ``Send`` as it is; otherwise minipar stages it through host memory)
cannot be asked of mpi4py: it has no query for it.  The rules, in order:

1. ``MINIPAR_CUDA_AWARE_MPI=1`` says yes, ``=0`` says no (you know your cluster);
2. the MPI library's own ``MPIX_Query_cuda_support()`` (MPICH >= 4 and Open MPI
   export it), called through ``ctypes`` in a child process;
3. Open MPI's ``ompi_info``: ``mpi_built_with_cuda_support``;
4. the ``mpich`` wheel from PyPI (minipar's default MPI) is built without CUDA: no;
5. otherwise: unknown.

Every probe is wrapped: a probe that fails prints its failure as its line, and
MPI starts in a child process (a broken MPI can hang or crash), so the doctor
itself always finishes, exit status 0.

``--hostfile FILE`` checks every host it lists too (:func:`hosts_probe`): one rank
per host, through minipar's own launcher, says its hostname, its Python, NumPy,
mpi4py and minipar versions and where minipar and Python are; they must be this
machine's (the same install, at the same path); then a 1 MiB all-reduce across the
hosts must give the right sum.  A host that cannot be reached is named by the
launch's one line.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from minipar.cli.options import ArgumentParser, add_json_options, one_line

PROG = "minipar doctor"
BACKEND_VAR = "MINIPAR_BACKEND"
CUDA_AWARE_VAR = "MINIPAR_CUDA_AWARE_MPI"
#: what the ``mpich`` wheel from PyPI writes into its library version
PYPI_MPICH = "pypi.org/p/mpich"
#: the install line for CuPy (the extras name prebuilt wheels)
INSTALL_CUPY = ("pip install 'minipar[gpu-cuda12]' (or 'minipar[gpu-cuda13]' for a CUDA 13 "
                "driver: nvidia-smi shows its version)")
#: seconds the MPI probe may take before it counts as failed
MPI_PROBE_TIMEOUT = 60.0
#: seconds the hosts' probe may take (a launch across the hosts)
HOSTS_PROBE_TIMEOUT = 120.0
ALLREDUCE_BYTES = 1 << 20
#: what every host must share with this one
SAME = ("python", "numpy", "mpi4py", "minipar", "minipar_path", "executable")

#: the child process that starts MPI: the library's version and its own CUDA answer
_MPI_PROBE = r"""
import ctypes, json, re
from mpi4py import MPI
out = {"library": MPI.Get_library_version().strip(), "standard": "%d.%d" % MPI.Get_version(),
       "query": None, "query_lib": None}
paths = []
try:
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1]
            name = p.rsplit("/", 1)[-1]
            if re.match(r"libmpi[^/]*\.so", name) and "fort" not in name and p not in paths:
                paths.append(p)
except OSError:
    pass
for p in paths + [None]:
    try:
        fn = getattr(ctypes.CDLL(p), "MPIX_Query_cuda_support", None)
    except OSError:
        continue
    if fn is not None:
        fn.restype, fn.argtypes = ctypes.c_int, []
        out["query"], out["query_lib"] = int(fn()), p or "the process"
        break
print(json.dumps(out))
"""


def _failed(e: BaseException) -> str:
    return f"failed: {type(e).__name__}: {one_line(str(e))}"


def probe(fn: Callable[[], Any], default: Any = None) -> tuple[Any, str | None]:
    """``(fn(), None)``, or ``(default, "failed: ...")`` if ``fn`` raises anything."""
    try:
        return fn(), None
    except Exception as e:  # a probe never stops the doctor
        return default, _failed(e)


def mpi_probe(timeout: float = MPI_PROBE_TIMEOUT) -> dict[str, Any]:
    """Start MPI in a child process: ``library`` (its whole version text), ``standard``,
    ``query`` (``MPIX_Query_cuda_support()``: 1, 0, or None when not exported) and
    ``query_lib``.  Raises RuntimeError naming what went wrong."""
    try:
        proc = subprocess.run([sys.executable, "-c", _MPI_PROBE], capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"MPI did not start within {timeout:g} s") from None
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        err = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise RuntimeError(f"the MPI probe exited {proc.returncode}: "
                           f"{err[-1] if err else 'no output'}")
    return json.loads(lines[-1])


def ompi_built_with_cuda(timeout: float = 30.0) -> bool | None:
    """Open MPI's ``ompi_info``: was it built with CUDA support (None: no ompi_info)."""
    import shutil

    exe = shutil.which("ompi_info")
    if exe is None:
        return None
    out = subprocess.run([exe, "--parsable", "--all"], capture_output=True, text=True,
                         timeout=timeout, check=False).stdout
    for line in out.splitlines():
        if line.startswith("mca:mpi:base:param:mpi_built_with_cuda_support:value:"):
            return line.rsplit(":", 1)[-1].strip() == "true"
    return None


def cuda_aware(env: str | None, mpi: dict[str, Any] | None,
               ompi: Callable[[], bool | None] = ompi_built_with_cuda) -> dict[str, Any]:
    """Is the MPI CUDA-aware: ``{"answer": "yes"|"no"|"unknown", "rule": why,
    "library_says": the library's own answer ("yes"|"no"|None)}`` by the module's rules.

    ``env``: the value of ``MINIPAR_CUDA_AWARE_MPI`` (None: unset); ``mpi``: what
    :func:`mpi_probe` returned (None: it failed)."""
    says, why = None, "mpi4py has no query for it"
    if mpi is not None:
        library = " ".join(mpi["library"].splitlines()[0].split()) if mpi.get("library") else "MPI"
        if mpi.get("query") is not None:
            says = "yes" if mpi["query"] else "no"
            why = f"MPIX_Query_cuda_support() of {mpi['query_lib']} returned {mpi['query']}"
            if not mpi["query"] and PYPI_MPICH in mpi.get("library", ""):
                why += ": the mpich wheel from PyPI is built without CUDA"
        elif "Open MPI" in mpi.get("library", "") and (built := probe(ompi)[0]) is not None:
            says = "yes" if built else "no"
            why = f"ompi_info: mpi_built_with_cuda_support is {str(built).lower()}"
        elif PYPI_MPICH in mpi.get("library", ""):
            says, why = "no", "the mpich wheel from PyPI is built without CUDA"
        else:
            why = f"mpi4py has no query for it and {library} exports no MPIX_Query_cuda_support"
    value = (env or "").strip()
    if value in ("0", "1"):
        answer = "yes" if value == "1" else "no"
        rule = f"{CUDA_AWARE_VAR}={value} says so"
        if says is not None and says != answer:
            rule += f"; the library says {says}: {why}"
        return {"answer": answer, "rule": rule, "library_says": says}
    return {"answer": says or "unknown", "rule": why, "library_says": says}


def cupy_probe() -> dict[str, Any]:
    """CuPy as installed: ``{"installed": False}`` or its version, the CUDA runtime and
    driver versions and one ``{"name", "memory"}`` per GPU it sees.  Raises what CuPy
    raises when the driver is broken."""
    try:
        import cupy  # type: ignore[import-not-found]
    except ImportError:
        return {"installed": False}
    rt = cupy.cuda.runtime
    out: dict[str, Any] = {"installed": True, "version": cupy.__version__, "gpus": []}
    out["runtime"], _ = probe(rt.runtimeGetVersion)
    out["driver"], _ = probe(rt.driverGetVersion)
    for i in range(rt.getDeviceCount()):
        props = rt.getDeviceProperties(i)
        name = props["name"]
        out["gpus"].append({"name": name.decode() if isinstance(name, bytes) else str(name),
                            "memory": int(props["totalGlobalMem"])})
    return out


def _cuda_version(v: int | None) -> str:
    """CUDA's integer version (12040) as text ("12.4")."""
    return "?" if v is None else f"{v // 1000}.{v % 1000 // 10}"


def gpus_text(gpus: list[dict[str, Any]]) -> str:
    """``1 GPU: 0 NVIDIA H200 (139.8 GiB)``, one entry per GPU."""
    names = ", ".join(f"{i} {g['name']} ({g['memory'] / 2**30:.1f} GiB)"
                      for i, g in enumerate(gpus))
    return f"{len(gpus)} GPU{'s' * (len(gpus) != 1)}: {names}"


def collect() -> dict[str, Any]:
    """Every probe: ``{"lines": {label: text, ...}, "fix": [...], ...}``, never raising."""
    env = os.environ
    lines: dict[str, str] = {}
    lines["Python"] = f"{platform.python_version()} ({sys.executable})"

    def version(module: str) -> str:
        return __import__(module).__version__

    for label, module in (("NumPy", "numpy"), ("mpi4py", "mpi4py")):
        v, err = probe(lambda m=module: version(m))
        lines[label] = err or v

    mpi, mpi_err = probe(mpi_probe)
    lines["MPI"] = mpi_err or (f"{' '.join(mpi['library'].splitlines()[0].split())} "
                               f"(MPI standard {mpi['standard']})")

    asked = env.get(BACKEND_VAR)
    shown = f"{BACKEND_VAR}={asked}" if asked is not None else f"{BACKEND_VAR} unset"
    backend, backend_err = probe(lambda: __import__("minipar.backend", fromlist=["name"]))
    name = getattr(backend, "name", None)
    lines["backend"] = f"{shown}: " + (f"cannot load: {backend_err.split(': ', 2)[-1]}"
                                      if backend_err else name)

    cp, cp_err = probe(cupy_probe)
    if cp_err:
        lines["CuPy"] = cp_err
    elif not cp["installed"]:
        lines["CuPy"] = "not installed"
    else:
        lines["CuPy"] = (f"{cp['version']}, CUDA runtime {_cuda_version(cp['runtime'])}, "
                         f"driver {_cuda_version(cp['driver'])}")
    gpus = (cp or {}).get("gpus") or []

    if name == "cupy":
        lines["device"] = gpus_text(gpus) if gpus else "CuPy loaded, but it lists no GPU"
    else:
        lines["device"] = "none (host only)"
        if gpus:
            lines["device"] += f"; CuPy sees {gpus_text(gpus)}"

    aware, aware_err = probe(lambda: cuda_aware(env.get(CUDA_AWARE_VAR), mpi))
    lines["CUDA-aware MPI"] = aware_err or f"{aware['answer']} ({aware['rule']})"
    from minipar import host_memory  # what the minipar command asked of malloc at its start

    lines["host memory"] = f"freed memory {host_memory.status()}"

    fix = fixes(asked, name, backend_err, cp, gpus, aware, mpi_err, env.get(CUDA_AWARE_VAR))
    return {"lines": lines, "fix": fix, "backend": name,
            "cuda_aware_mpi": (aware or {}).get("answer", "unknown"),
            "cuda_aware_rule": (aware or {}).get("rule", aware_err),
            "gpus": gpus, "mpi_library": (mpi or {}).get("library"),
            "host_memory": host_memory.status()}


def fixes(asked: str | None, name: str | None, backend_err: str | None,
          cp: dict[str, Any] | None, gpus: list[dict[str, Any]],
          aware: dict[str, Any] | None, mpi_err: str | None,
          aware_env: str | None) -> list[str]:
    """What to do, one sentence each (``["nothing to fix"]`` when all is well)."""
    out = []
    wants_gpu = (asked or "").strip().lower() == "cupy"
    if backend_err and wants_gpu and cp is not None and not cp.get("installed"):
        out.append(f"{BACKEND_VAR}=cupy needs CuPy: {INSTALL_CUPY}, or unset {BACKEND_VAR} "
                   "to run on NumPy")
    elif backend_err and wants_gpu and not gpus:
        out.append(f"{BACKEND_VAR}=cupy but CuPy sees no usable GPU: check nvidia-smi and "
                   f"CUDA_VISIBLE_DEVICES, or unset {BACKEND_VAR} to run on NumPy")
    elif backend_err:
        out.append(backend_err.split(": ", 2)[-1])
    if name not in (None, "cupy") and gpus:
        out.append(f"this machine has a GPU: {BACKEND_VAR}=cupy runs minipar on it")
    if mpi_err:
        out.append("MPI does not start: minipar's launcher needs a working mpi4py "
                   "(pip install -e . brings the mpich wheel)")
    if (aware_env or "").strip() not in ("", "0", "1"):
        out.append(f"{CUDA_AWARE_VAR}={aware_env!r} is neither 1 nor 0: it is ignored")
    if aware is not None and name not in (None, "numpy"):
        if aware["answer"] == "yes" and aware["library_says"] == "no":
            out.append(f"{CUDA_AWARE_VAR}=1 but the MPI library says it is not CUDA-aware: "
                       "it would read device pointers as host memory; unset it")
        elif aware["answer"] == "no" and aware["library_says"] == "no":
            out.append("device buffers are staged through host memory, a copy each way per "
                       f"message (a CUDA-aware MPI, with {CUDA_AWARE_VAR}=1, takes them directly)")
        elif aware["answer"] != "yes":
            msg = (f"set {CUDA_AWARE_VAR}=1 to hand device buffers to MPI directly"
                   if aware["library_says"] == "yes" else
                   f"set {CUDA_AWARE_VAR}=1 if your MPI is CUDA-aware")
            out.append(f"{msg}; device buffers are staged through host memory otherwise "
                       "(a copy each way per message)")
    return out or ["nothing to fix"]


def format_text(data: dict[str, Any]) -> str:
    """The doctor's lines, labels aligned, one ``fix`` line per fix."""
    rows = list(data["lines"].items()) + [("fix", f) for f in data["fix"]]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def host_facts() -> dict[str, Any]:
    """What a host must share with the others: versions, and where minipar and Python are."""
    import mpi4py
    import numpy

    import minipar

    return {"python": platform.python_version(), "numpy": numpy.__version__,
            "mpi4py": mpi4py.__version__, "minipar": minipar.__version__,
            "minipar_path": os.path.dirname(os.path.abspath(minipar.__file__)),
            "executable": sys.executable}


def _host_rank(payload: dict[str, Any]) -> dict[str, Any] | None:
    """Rank side of :func:`hosts_probe`: this host's facts, then the all-reduce (rank 0
    returns everything)."""
    import socket
    import time

    import numpy as np

    from minipar import collectives
    from minipar.comm import TracedComm

    comm = TracedComm()
    facts = {"host": socket.gethostname(), **host_facts()}
    x = np.full(payload["bytes"] // 8, comm.rank + 1.0)
    comm.Barrier()
    t0 = time.perf_counter()
    y = collectives.allreduce(comm, x)
    seconds = time.perf_counter() - t0
    n = comm.size
    facts["allreduce_ok"] = bool((y == n * (n + 1) / 2).all())
    every = comm.comm.gather((facts, seconds), root=0)
    if every is None:
        return None
    return {"hosts": [f for f, _ in every], "seconds": max(t for _, t in every)}


def read_hosts(path: str) -> list[str]:
    """The hosts a host file lists (``host`` or ``host:slots`` a line; ``#`` comments)."""
    hosts = []
    for line in open(path, encoding="utf-8"):
        word = line.split("#", 1)[0].strip()
        if word:
            hosts.append(word.split()[0].rsplit(":", 1)[0])
    return hosts


def hosts_probe(hostfile: str, timeout: float = HOSTS_PROBE_TIMEOUT) -> dict[str, Any]:
    """One rank on every host of ``hostfile``: ``{"hosts": [listed], "reached": [{host,
    python, ...}], "differ": [what differs from this machine], "allreduce": {...}}``, or
    ``{"hosts", "error": the launch's one line}`` when they cannot all be reached."""
    import tempfile

    from minipar import launch

    hosts = read_hosts(hostfile)
    out: dict[str, Any] = {"hosts": hosts}
    if not hosts:
        return {**out, "error": f"{hostfile} lists no host"}
    with tempfile.TemporaryDirectory(prefix="minipar-doctor-") as d:
        one_each = os.path.join(d, "hosts")  # one rank per host
        with open(one_each, "w", encoding="utf-8") as f:
            f.write("".join(f"{h}:1\n" for h in hosts))
        try:
            result, proc = launch.run_json(len(hosts), "minipar.cli.doctor",
                                           {"bytes": ALLREDUCE_BYTES}, timeout=timeout,
                                           hostfile=one_each)
        except launch.LaunchError as e:
            return {**out, "error": one_line(str(e))}
    if result is None:
        return {**out, "error": proc.failure or "the hosts' probe printed no result"}
    here = host_facts()
    out["reached"] = result["hosts"]
    out["differ"] = [f"{f['host']}: {k} {f[k]} (here {here[k]})"
                     for f in result["hosts"] for k in SAME if f[k] != here[k]]
    out["allreduce"] = {"bytes": ALLREDUCE_BYTES, "seconds": result["seconds"],
                        "ok": all(f["allreduce_ok"] for f in result["hosts"])}
    return out


def hosts_lines(h: dict[str, Any]) -> dict[str, str]:
    """The doctor's lines for the hosts: reached, the same, the all-reduce."""
    if "error" in h:
        return {"hosts": f"{len(h['hosts'])} listed ({', '.join(h['hosts'])}); cannot run "
                         f"on them all: {h['error']}"}
    names = ", ".join(f["host"] for f in h["reached"])
    lines = {"hosts": f"{len(h['hosts'])} listed, all reached, one rank each: {names}"}
    lines["same install"] = ("yes: Python, NumPy, mpi4py and minipar versions, minipar's and "
                             "Python's paths" if not h["differ"] else
                             "NO: " + "; ".join(h["differ"]))
    a = h["allreduce"]
    lines["all-reduce"] = (f"{a['bytes'] / 2**20:g} MiB across the hosts: "
                           + ("the right sum" if a["ok"] else "A WRONG SUM")
                           + f", {a['seconds'] * 1e3:.1f} ms")
    return lines


def _parser() -> ArgumentParser:
    from minipar.run.options import existing_file

    p = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    add_json_options(p, "the probes")
    p.add_argument("--hostfile", type=existing_file, default=None,
                   help="also check every host it lists: reached, the same versions and "
                        "paths, a 1 MiB all-reduce across them")
    return p


def main(argv: list[str]) -> int:
    from minipar import launch
    from minipar.bench import emit

    if launch.is_worker(argv):  # a rank of --hostfile's probe
        return launch.serve(_host_rank, argv)
    a = _parser().parse_args(argv)
    data = collect()
    if a.hostfile is not None:
        h, err = probe(lambda: hosts_probe(a.hostfile))
        data["hosts"] = h or {"error": err}
        data["lines"].update(hosts_lines(h) if h else {"hosts": err})
        if h and ("error" in h or h["differ"] or not h["allreduce"]["ok"]):
            data["fix"] = [f for f in data["fix"] if f != "nothing to fix"] + [
                "every host needs the same install at the same path (README: Running across "
                "machines)"]
    return emit(PROG, a, data, format_text(data))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
