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

Bad input, one line and exit 2: DIR not a (complete) checkpoint, a checkpoint of a
model that was not trained on text (the modular-sum task has no bytes to show),
an empty prompt, a value out of range.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from minipar.cli.options import ArgumentParser, error_line, integer, number

PROG = "minipar sample"


def _parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("dir", metavar="DIR", help="a checkpoint: a step directory or a root "
                   "holding them (its latest complete one)")
    p.add_argument("--prompt", default="The ", help="the text to continue (default %(default)r)")
    p.add_argument("--tokens", type=integer(0), default=200,
                   help="bytes to generate (default %(default)s)")
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
    from minipar import backend
    from minipar.data import tokenizer
    from minipar.nn import GPT, GPTConfig
    from minipar.nn.decoding import generate
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
    ids = generate(model, params, tokenizer.encode(prompt), tokens, temperature=temperature,
                   top_k=top_k, seed=seed)
    # complete characters only: the bytes the decoder still holds at the end (without
    # final=True) begin a character that --tokens cut short
    return tokenizer.stream_decoder().decode(bytes(ids)), m


def main(argv: list[str]) -> int:
    """``minipar sample DIR``: 0 after printing the text; 2 (one line) on bad input."""
    a = _parser().parse_args(argv)
    try:
        text, _ = sample(a.dir, a.prompt, a.tokens, a.temperature, a.top_k, a.seed)
    except ValueError as e:  # CheckpointError included: names the path and the problem
        return error_line(PROG, e)
    # an output that cannot show every character (PYTHONIOENCODING=ascii, a file in a
    # legacy code page) gets "?" for those, not a traceback after the work is done
    if callable(getattr(sys.stdout, "reconfigure", None)):
        sys.stdout.reconfigure(errors="replace")
    print(text)
    return 0
