"""Offloading: what the accelerator holds but does not need now goes to host or disk.

EN offloading (ZeRO-Offload, ZeRO-Infinity) · RU выгрузка (оффлоадинг) · ZH 卸载

The technique: read ``activations.py`` (43 code lines), ``optimizer.py`` (54 code
lines), then ``store.py`` (103 code lines), in this order (Ren et al. 2021,
"ZeRO-Offload", arXiv 2101.06840; Rajbhandari et al. 2021, "ZeRO-Infinity", arXiv
2104.07857: NVMe as a tier, activation checkpoints offloaded; two halves over one pair
of tiers):

- :mod:`.activations` — ``Offload``: executor hooks that move a unit's
  ``saved`` out after forward and back before backward (around any hooks,
  :class:`minipar.parallel.remat.Checkpointing` included);
- :mod:`.optimizer` — ``OptimizerOffload``: fp32 master weights and moments on
  host or disk, the optimizer step there;
- :mod:`.store` — the tiers both use: a ``Store`` moves a buffer to host memory or
  to a ``numpy.memmap`` file and back (each buffer once, views rebuilt).

Then the shell:

- :mod:`.wrap` — ``MemoryWrap``: remat, offload or both around a strategy's
  hooks (DDP's ``wrap_hooks``, ZeRO's ``memory_wrap``), with their measurements;
  ``check_target``, the one check of a target and folder;
- :mod:`.measure` — what they held and moved, measured around the cores:
  ``kept_by_place`` (a walk's activation bytes on device, host and disk: the
  formula device = device₀ − M the tests check), ``ActivationLedger`` (the
  activation bytes remat's hooks hold, at most and now, on the device),
  ``MeteredStore`` and ``MeteredOptimizerOffload`` (bytes and seconds moved).

Every rank alike (nothing crosses ranks; N ranks of ZeRO offload their 1/N shard):

    device                        host (pinned)              disk (memmap files)
    +------------------------+    +--------------------+     +--------------------+
    | 16-bit params          |    | saved activations  |     | saved activations  |
    | grads (stream down)    |--->| fp32 master, m, v  | or  | fp32 master, m, v  |
    | one unit's saved, in   |<---| (the optimizer     |     | (paged in by the   |
    | its forward / backward |    |  step runs here)   |     |  operating system) |
    +------------------------+    +--------------------+     +--------------------+
"""
