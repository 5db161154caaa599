"""minipar.host_memory: freed memory kept for the next step, counted in page faults.

Page faults are counted by the kernel (``getrusage``), not timed: the figures do not
depend on the machine's load.  Each case runs in a fresh interpreter, since the
setting lasts for the life of a process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# a small GPT trained a few steps; prints the page faults per step after two warm-up steps
STEPS = """
import json, resource, sys
from minipar import host_memory
said = host_memory.keep_freed_memory() if sys.argv[1] == "keep" else host_memory.status()
from minipar.parallel.common import RunSpec
from minipar.precision import ModelStates
spec = RunSpec(vocab=64, seq=32, d_model=128, layers=2, heads=4, batch=8, steps=8, lr=1e-3,
               precision="float32")
model = spec.model()
states = ModelStates(spec.precision, spec.initial_params(), spec.optimizer, **spec.opt_kwargs())
def step(r):
    x, y = spec.global_batch(r)
    _, g = model.loss_and_grads(states.param_views(), x, y)
    states.set_grads(g)
    states.step()
step(0); step(1)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for r in range(2, 7):
    step(r)
print(json.dumps({"said": said, "faults_per_step":
                  (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 5}))
"""


def _faults(mode: str, **env: str) -> dict:
    """Run STEPS in a fresh interpreter without glibc's MALLOC_ variables (an in-process
    ``minipar`` command of another test may have set them in this one's environment)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True,
                         timeout=120, env={**clean, **env}, check=True)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_kept_memory_leaves_a_step_without_page_faults():
    kept = _faults("keep")
    default = _faults("default")
    print(f"page faults per step: {kept['faults_per_step']:.1f} kept, "
          f"{default['faults_per_step']:.1f} with the system's default")
    assert kept["said"] == ("kept for reuse (glibc mallopt; MINIPAR_KEEP_FREED_MEMORY=0 turns "
                            "it off)")
    assert default["said"].startswith("not asked")
    # tens at most (Python's own small-object arenas) against thousands
    assert kept["faults_per_step"] < 50 < 10 * 50 < default["faults_per_step"]


def test_the_switch_and_the_entry_points(tmp_path):
    off = _faults("keep", MINIPAR_KEEP_FREED_MEMORY="0")
    assert off["said"] == "given back to the kernel, glibc's defaults (MINIPAR_KEEP_FREED_MEMORY=0)"
    assert _faults("keep", MINIPAR_KEEP_FREED_MEMORY=" Off ")["said"] == (
        "given back to the kernel, glibc's defaults (MINIPAR_KEEP_FREED_MEMORY=Off)")
    assert _faults("keep", MINIPAR_KEEP_FREED_MEMORY="banana")["said"] == (  # said, not guessed
        "kept for reuse (glibc mallopt; MINIPAR_KEEP_FREED_MEMORY='banana' is not one of 0, "
        "false, no, off, so on)")
    assert _faults("default")["said"] == "not asked (the system's default)"  # import: nothing
    # the minipar command asks at its start (doctor reports it), and so does every rank
    doctor = subprocess.run([sys.executable, "-m", "minipar.cli", "doctor", "--json"],
                            capture_output=True, text=True, timeout=120, check=True)
    want = ("kept for reuse (glibc mallopt; MINIPAR_KEEP_FREED_MEMORY=0 turns it off)"
            if sys.platform.startswith("linux") else None)
    said = json.loads(doctor.stdout)["host_memory"]
    assert said == want or want is None, said
    script = tmp_path / "said.py"
    script.write_text("from mpi4py import MPI\nfrom minipar import host_memory\n"
                      "print('SAID', MPI.COMM_WORLD.rank, host_memory.status())\n")
    from minipar import launch

    out = launch.run(2, str(script), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    said = sorted(ln for ln in out.stdout.splitlines() if ln.startswith("SAID"))
    assert [ln.split(" ", 2)[2] for ln in said] == [want or said[0].split(" ", 2)[2]] * 2, said


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
def test_a_commands_children_keep_freed_memory_from_their_start():
    """A benchmark's measuring subprocess is started by the command, not through it: it
    inherits glibc's own variables, and its steps fault no pages either."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    child = ("import os, subprocess, sys\n"
             "from minipar import host_memory\n"
             "host_memory.keep_freed_memory()\n"
             "print({k: os.environ[k] for k in\n"
             "       ('MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_')})\n"
             "sys.stdout.flush()\n"
             "subprocess.run([sys.executable, '-c', sys.argv[1], 'default'], check=True)\n")
    out = subprocess.run([sys.executable, "-c", child, STEPS], capture_output=True, text=True,
                         timeout=120, env=env, check=True).stdout.splitlines()
    assert out[0] == str({"MALLOC_MMAP_THRESHOLD_": "33554432",
                          "MALLOC_TRIM_THRESHOLD_": "1073741824"})
    grandchild = json.loads(out[-1])
    assert grandchild["said"].startswith("not asked")  # it never called keep_freed_memory
    assert grandchild["faults_per_step"] < 50
