"""Explorers: a figure and its numbers as a plain function of a few inputs, and a thin widget.

EN interactive explorers · RU интерактивные исследователи · ZH 交互式探索器

Each explorer is a function of its inputs that returns a :class:`~minipar.viz.explore.view.View`
(the numbers as a dict, the lines a learner reads, a matplotlib figure): tested without a
browser, drawn headless by the notebooks, and wrapped for Jupyter by
:func:`~minipar.viz.explore.view.explore`, which builds one control per entry of the
explorer's ``CONTROLS`` (ipywidgets when installed: the ``notebooks`` extra) and redraws
the same output on every change.  A new option (a schedule, a context-parallel kind, a
precision, a preset) is one more entry in the module's table.  Every number comes from
:mod:`minipar.plan` or the package's own simulator — the formulas the tests check against
real ranks — and :mod:`~minipar.viz.explore.predict` puts a learner's prediction beside a
measured run (:mod:`minipar.launch`, a few seconds on local ranks) and the formula.

One module per explorer (import it directly):

* ``memory``     memory per device by kind, every axis, ZeRO, SP, remat, offload, precision
* ``step``       the planner's step time by part, MFU, bubble, bytes per axis
* ``schedule``   a pipeline schedule's Gantt chart, bubble against its formula, in flight
* ``collective`` an all-reduce step by step (which chunk each rank sends), α–β–γ times
* ``tensor``     where f and g (SP's all-gather / reduce-scatter) sit; bytes, memory vs t
* ``experts``    router load per expert against the capacity factor, dropped tokens
* ``predict``    predict, then measure on real ranks; the usual mistake when wrong
"""
