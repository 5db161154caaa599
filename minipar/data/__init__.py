"""Data — данные — 数据: what the models are trained on, every batch from ``(seed, step)``.

Read in this order:

=================  ==========================================================================
``batches``        the contract of every data set: the global batch of step s is a pure
                   function of (seed, s) (``batch_rng``), any rows [lo, hi) of it
                   (``batch_rows``), so a parallel run sees the serial run's data
``synthetic``      tasks with a known answer: ``modular_sum`` (a Fibonacci sequence mod V,
                   for the GPT; best loss ln(V)/T), ``spirals`` (for the MLP)
``tokenizer``      text as UTF-8 bytes: vocabulary 256, no unknown token, ``decode`` never
                   raises (invalid bytes show as U+FFFD)
``text``           one UTF-8 text as a data set: train / validation split (the last 10%),
                   ``TextData.batch`` by (seed, step), the unigram entropy to beat, a SHA-256
                   fingerprint; ``load(path)`` refuses a bad file in one line
``corpus``         the embedded default text: the glossary cards (en, ru, zh) and minipar's
                   module docstrings, read from the installed package
=================  ==========================================================================

Nothing is imported here: ``from minipar.data import synthetic`` (or ``text``,
...) names the module it uses.
"""
