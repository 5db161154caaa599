"""Every ``minipar ...`` command of README.md runs as a learner types it.

The commands are read from the README itself: each line of a ```` ```sh ```` block
(shell variables such as the real-text chain's ``M="..."`` expanded the way the
shell would), and each inline `` `minipar VERB ...` `` span of the prose (the
learning path's commands are there).  Each level-2 or level-3 section runs in order in a
fresh folder, so that a command that reads what an earlier one wrote (``minipar
sample ckpt`` after ``--save ckpt``; ``exercise check`` after ``exercise start``)
finds it exactly as the learner would.  Every command must exit 0.

Not run: the set-up lines (``python3 -m venv``, ``pip install``: tests/test_readme.py
keeps them unchanged), ``jupyter lab`` and ``source``, which are not minipar
commands; and the lines listed in :data:`NOT_COMMANDS` and :data:`CLUSTER_ONLY`.
A few long-running commands get shorter sizes (:data:`SHORTER`), each with its
reason; every other command runs as typed.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minipar.exercises import EXERCISES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")

#: inline spans that name a verb or a family in a sentence, not a command to type
NOT_COMMANDS = {
    "minipar run",                  # "`minipar train` and `minipar run` differ in their defaults"
    "minipar run dp / ps / zero",   # the table's heading
}

#: commands for a cluster this machine is not: an MPI at /opt/mpich and Slurm's srun
#: (they start with the variable, so they are not ``minipar ...`` spans; listed so that
#: the test notices when the README changes them)
CLUSTER_ONLY = (
    "MINIPAR_MPIEXEC=/opt/mpich/bin/mpiexec minipar run zero -n 16 --hostfile $NODEFILE",
    'MINIPAR_MPIEXEC=srun MINIPAR_MPIEXEC_ARGS="--mpi=pmi2" minipar run dp -n 16',
)

#: command as typed -> the options appended here, and why: the README's sizes take
#: 5-30 s each on a 2-core machine; the appended option only shortens the run, and
#: argparse takes the last of a repeated option (``--steps 300 --steps 2``)
SHORTER = {
    # 300 steps (5-7 s) to learn the task; 2 steps run the same code
    "minipar train": ["--steps", "2"],
    "minipar train --model gpt --steps 300": ["--steps", "2"],
    # 26 s: the byte-level GPT's 300 steps and a validation every 30; 2 steps without
    # validation still save the checkpoint that `minipar sample ckpt/` and `minipar
    # checkpoint info/export ckpt/` read next
    "minipar train --text --save ckpt/": ["--steps", "2", "--eval-every", "0"],
    # minutes: every notebook executed in full; one notebook in its quick mode runs the same
    # code path (execute, render, index)
    "minipar notebooks --html book/": ["--quick", "--only", "05_tensor_parallel"],
    # 8 s: 13 sizes from 8 B to 64 MiB, 20 calls each; two sizes, 3 calls
    "minipar bench collectives -n 4": ["--sizes", "8", "1024", "--iters", "3"],
    # 6 s: 50 steps on each side; 2 steps, one validation
    "minipar bench train": ["--steps", "2", "--eval-every", "2"],
    # 5 s: 4 model depths, 5 timed steps each; one depth, one step
    "minipar bench remat": ["--layers", "4", "--repeat", "1"],
    # minutes: 9 trainings of 200 steps (5 on 4 ranks); the four serial recipes of a tiny
    # model, 2 steps, no launch (tests/test_bench_precision.py runs its ZeRO++ row)
    "minipar bench precision": ["--steps", "2", "--eval-every", "2", "--eval-batches", "1",
                                "--layers", "1", "--d-model", "16", "--heads", "2",
                                "--seq", "8", "--batch", "4", "--no-zero"],
}

#: what the learner does between two commands: the file a command needs first
BEFORE = {
    # "edit it there": the learner's finished ring_allreduce.py, the reference solution
    "minipar exercise check ring_allreduce ring_allreduce.py -n 4":
        lambda cwd: shutil.copy(EXERCISES["ring_allreduce"].solution_path, cwd
                                / "ring_allreduce.py"),
    # "a file that says just `localhost` runs here"
    "minipar run dp -n 8 --hostfile hosts.txt":
        lambda cwd: (cwd / "hosts.txt").write_text("localhost\n", encoding="utf-8"),
    "minipar doctor --hostfile hosts.txt":
        lambda cwd: (cwd / "hosts.txt").write_text("localhost\n", encoding="utf-8"),
}

#: what a command must leave in the folder it ran in (the README says so)
AFTER = {
    "minipar exercise start ring_allreduce": "ring_allreduce.py",  # "into the current folder"
    "minipar train --text --save ckpt/": "ckpt",
    "minipar checkpoint export ckpt/ model.safetensors": "model.safetensors",
}

TIMEOUT_S = 60  # one command; the longest here takes ~5 s


def sections(text: str) -> dict[str, str]:
    """Level-2 and level-3 sections by title, in order (the real-text chain, a level-3
    section, saves into a ``ckpt`` of its own, not into the one ``Use`` trains)."""
    parts = re.split(r"^###? (.+)$", text, flags=re.MULTILINE)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def expand(line: str, variables: dict[str, str]) -> str:
    """``$NAME`` replaced by its value (an unknown variable is an error)."""
    def value(m: re.Match[str]) -> str:
        assert m.group(1) in variables, f"${m.group(1)} is not set in the README: {line}"
        return variables[m.group(1)]
    return re.sub(r"\$(\w+)", value, line)


def commands(section: str) -> list[str]:
    """The ``minipar ...`` commands of one section, in order, variables expanded,
    comments and quotes as the shell reads them (``shlex.join``: one text per command)."""
    found: list[str] = []
    variables: dict[str, str] = {}
    for m in re.finditer(r"```(\w*)\n(.*?)```|`([^`]+)`", section, re.DOTALL):
        if m.group(3) is not None:  # an inline span (prose wraps it over lines)
            span = " ".join(m.group(3).split())
            if span.startswith("minipar ") and span not in NOT_COMMANDS:
                found.append(shlex.join(shlex.split(span)))
            continue
        if m.group(1) != "sh":
            continue
        for line in m.group(2).splitlines():
            words = shlex.split(line, comments=True)
            if len(words) == 1 and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
                name, value = words[0].split("=", 1)
                variables[name] = value
            elif words and words[0] == "minipar":
                found.append(shlex.join(shlex.split(expand(line, variables), comments=True)))
    return found


SECTIONS = {title: commands(body) for title, body in sections(README).items()}
RUN = {title: cmds for title, cmds in SECTIONS.items() if cmds}


def test_the_commands_are_found() -> None:
    """The reader finds the commands (this test fails if the README's shape changes
    under it): the learning path's, the real-text chain with $M expanded, the cluster
    lines it leaves out, and every substitution names a command the README has."""
    every = [c for cmds in SECTIONS.values() for c in cmds]
    assert len(every) > 50, every
    path = SECTIONS["Learning path"]
    for c in ("minipar run ep", "minipar demo -n 4", "minipar exercise start ring_allreduce",
              "minipar plan --gpt 96,12288,51200,2048 --gpus 1024 --cluster dgx-a100"):
        assert c in path, (c, path)
    use = SECTIONS["Real text: train, sample, stop and resume on any layout"]
    assert ("minipar run zero --stage 3 -n 4 --steps 4 --text --d-model 32 --layers 4 "
            "--heads 4 --seq 32 --batch 8 --save ckpt") in use
    assert "minipar sample ckpt/ --prompt 'Конвейер '" in SECTIONS["Use"]
    assert not any("$" in c for c in every), every
    flat = " ".join(README.split())
    for line in CLUSTER_ONLY:
        assert line in flat, line
    for c in (*SHORTER, *BEFORE, *AFTER):
        assert c in every, c


@pytest.mark.parametrize("title", list(RUN))
def test_every_command_of_the_section_runs_as_typed(title: str, tmp_path: Path) -> None:
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get(
               "PYTHONPATH")])])}
    done: set[str] = set()
    times: list[str] = []
    for command in RUN[title]:
        if command in done:  # the same text twice (`minipar run dp`): once is the proof
            continue
        done.add(command)
        if command in BEFORE:
            BEFORE[command](tmp_path)
        argv = [*shlex.split(command)[1:], *SHORTER.get(command, [])]
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "minipar.cli", *argv], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
                              check=False)
        times.append(f"{time.perf_counter() - t0:.1f}s {command}")
        assert proc.returncode == 0, (f"`{command}` (README, {title}) exited "
                                      f"{proc.returncode}:\n{proc.stdout[-2000:]}\n"
                                      f"{proc.stderr[-2000:]}")
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        if command in AFTER:
            assert (tmp_path / AFTER[command]).exists(), (command, AFTER[command])
    print("\n".join(times))


def _options(help_text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", help_text))


def test_plan_help_lists_every_option_of_both_planners() -> None:
    """``minipar plan --help`` names every option ``minipar plan`` takes, the layout
    planner's (``--cluster``, ``--gpus``, ...) included."""
    def help_of(*argv: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "minipar.cli", "plan", *argv, "--help"],
                              capture_output=True, text=True, timeout=60, check=True)
        return proc.stdout

    plain = _options(help_of())
    layouts = _options(help_of("--cluster", "dgx-a100"))
    assert {"--cluster", "--gpus", "--global-batch", "--top"} <= layouts
    assert layouts <= plain, sorted(layouts - plain)


@pytest.mark.parametrize("argv,named", [
    (["--gpt", "96,12288,51200,2048", "--gpus", "1024"], "--gpus only applies"),
    (["--params", "7.5e9", "-n", "64", "--glob", "8"], "--global-batch only applies"),
    (["--params", "7.5e9", "-n", "64", "--top=3", "--layers", "4"], "--layers, --top only apply"),
])
def test_plan_refuses_the_layout_options_without_cluster(argv: list[str], named: str) -> None:
    """Listed in the help, the layout planner's options are not silently ignored without
    ``--cluster``: one line, exit 2, naming them and --cluster."""
    proc = subprocess.run([sys.executable, "-m", "minipar.cli", "plan", *argv],
                          capture_output=True, text=True, timeout=60, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and proc.stdout == "" and len(lines) == 1, proc.stderr
    assert lines[0].startswith("minipar plan: ") and named in lines[0], lines[0]
    assert "give --cluster too" in lines[0], lines[0]
