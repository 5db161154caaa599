"""``minipar sample``: text from a trained checkpoint — генерация текста — 文本生成.

EN sampling · RU сэмплирование · ZH 采样

    minipar train --text --steps 600 --save ckpt/      # a small GPT on the embedded text
    minipar sample ckpt/ --prompt "All-reduce " --tokens 200
    minipar sample ckpt/ --prompt "Конвейер " --temperature 0.8 --top-k 20 --seed 1

The checkpoint (any layout saved it: :mod:`minipar.parallel.checkpoint`) gives the
model's shape (its manifest) and its full tensors (assembled from every rank's
pieces, the fp32 master weights of a mixed-precision run); the prompt is turned
into UTF-8 bytes (:mod:`minipar.data.tokenizer`, vocabulary 256, so Russian and
Chinese work as they are), and :func:`minipar.nn.decoding.generate` continues it
one byte at a time with a key/value cache: ``--temperature`` 0 is greedy (the most
likely byte), higher is more varied; ``--top-k`` K samples among the K likeliest
bytes only; ``--seed`` makes a run repeatable.  The output is the prompt and its
continuation, decoded with replacement characters where the model wrote bytes
that are not UTF-8 (a sample is never refused for that); the first bytes of a
character that ``--tokens`` cuts short at the very end are left out (the model
did not get to finish it: they are not its mistake).

How many steps give what (the embedded text, the default small model, measured in
the train verb's README section): a few hundred steps give letters and spaces in
the text's proportions, words only later; a checkpoint of fewer than
:data:`READABLE_AFTER` steps is said so on stderr, with the step it holds.

``--tokens`` is at most :data:`MAX_TOKENS` (one byte a step, each a forward of the
model on this machine's CPU: a larger count would run for hours with no end in
sight).  A long run shows a progress bar on stderr (after one second); Ctrl-C
stops it: what was generated so far is printed, then ``minipar: interrupted``
(exit 130).

Bad input, one line and exit 2: DIR not a (complete) checkpoint, a checkpoint of a
model that was not trained on text (the modular-sum task has no bytes to show),
an empty prompt, a value out of range.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

from minipar.cli.options import ArgumentParser, error_line, integer, number

PROG = "minipar sample"
#: most bytes one run generates
MAX_TOKENS = 100_000
#: fewer steps than this, on the default model, give letters rather than words
READABLE_AFTER = 1500


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("dir", metavar="DIR", help="a checkpoint: a step directory or a root "
                   "holding them (its latest complete one)")
    p.add_argument("--prompt", default="The ", help="the text to continue (default %(default)r)")
    p.add_argument("--tokens", type=integer(0, MAX_TOKENS), default=200,
                   help=f"bytes to generate, 0 to {MAX_TOKENS:,} (default %(default)s)")
    p.add_argument("--temperature", type=number(minimum=0), default=0.8,
                   help="0: greedy; 1: the model's own distribution (default %(default)s)")
    p.add_argument("--top-k", type=integer(1, 256), default=None,
                   help="sample among the K likeliest bytes only (default: all 256)")
    p.add_argument("--seed", type=integer(0), default=0,
                   help="the sampler's random seed (default %(default)s)")
    return p


def sample(path: str, prompt: str, tokens: int, temperature: float = 0.8,
           top_k: int | None = None, seed: int = 0) -> tuple[str, dict[str, Any]]:
    """(prompt + continuation, the checkpoint's manifest); ValueError (one line) for a
    checkpoint that is not a text model's, or a bad argument."""
    from minipar.data import tokenizer

    new, m = sampler(path, prompt, tokens, temperature, top_k, seed)
    return decode([int(t) for t in tokenizer.encode(prompt)] + list(new)), m


def sampler(path: str, prompt: str, tokens: int, temperature: float = 0.8,
            top_k: int | None = None, seed: int = 0) -> tuple[Iterator[int], dict[str, Any]]:
    """(the new byte ids, one at a time as they are sampled; the checkpoint's manifest),
    every argument checked before the first byte."""
    from minipar import backend
    from minipar.data import tokenizer
    from minipar.nn import GPT, GPTConfig
    from minipar.nn.decoding import stream
    from minipar.parallel import checkpoint

    d, m = checkpoint.read_manifest(path)
    data = m.get("data") or {}
    if data.get("tokenizer") != tokenizer.NAME:
        task = data.get("task", "modular_sum")
        task = "the modular-sum task" if task == "modular_sum" else repr(task)
        raise ValueError(f"{d} is a checkpoint of a model trained on {task}, not on text: sample "
                         "needs one saved by `minipar train --text` or `minipar run ... --text`")
    if not prompt:
        raise ValueError("--prompt is empty: give at least one character to continue")
    d, m, tensors = checkpoint.full_tensors(d)
    dtype = "float64" if m["precision"] == "float64" else "float32"
    model = GPT(GPTConfig(**m["model"], dtype=dtype))
    params = {n: backend.to_device(a.astype(dtype)) for n, a in tensors.items()}
    return stream(model, params, tokenizer.encode(prompt), tokens, temperature=temperature,
                  top_k=top_k, seed=seed), m


def decode(ids: list[int]) -> str:
    """Complete characters only: the bytes the decoder still holds at the end (without
    final=True) begin a character that --tokens cut short."""
    from minipar.data import tokenizer

    return tokenizer.stream_decoder().decode(bytes(ids))


def main(argv: list[str]) -> int:
    """``minipar sample DIR``: 0 after printing the text; 2 (one line) on bad input; 130
    on Ctrl-C, after printing what was generated."""
    from minipar import progress
    from minipar.data import tokenizer

    a = _parser().parse_args(argv)
    try:
        new, m = sampler(a.dir, a.prompt, a.tokens, a.temperature, a.top_k, a.seed)
    except ValueError as e:  # CheckpointError included: names the path and the problem
        return error_line(PROG, e)
    step = m.get("step")
    if isinstance(step, int) and step < READABLE_AFTER:
        print(f"({PROG}: this checkpoint holds step {step}; on the default model the text "
              f"reads as words only after about {READABLE_AFTER:,} steps: train longer "
              f"with --steps, or --resume it)", file=sys.stderr)
    # an output that cannot show every character (PYTHONIOENCODING=ascii, a file in a
    # legacy code page) gets "?" for those, not a traceback after the work is done
    if callable(getattr(sys.stdout, "reconfigure", None)):
        sys.stdout.reconfigure(errors="replace")
    ids = [int(t) for t in tokenizer.encode(a.prompt)]
    bar = progress.bar(a.tokens, desc="byte", delay=1.0)
    try:
        for t in new:
            ids.append(t)
            bar.update(1)
    except KeyboardInterrupt:
        bar.close()
        print(decode(ids))  # what was generated before Ctrl-C, then "minipar: interrupted"
        raise
    bar.close()
    print(decode(ids))
    return 0
