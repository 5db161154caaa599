"""Figures, all drawn with matplotlib from data the package computes.

Notebooks draw nothing by hand: every figure is a function here, so it is
tested and stays short.  One submodule per topic (import it directly):

* ``minipar.viz.ring``      ring all-reduce steps, bytes and bandwidth
* ``minipar.viz.model``     serial model: memory by category, training curve, MoE load
* ``minipar.viz.overview``  the map of the field: what each technique splits
* ``minipar.viz.pipeline``  pipeline Gantt chart, bubble against m, activations in flight
* ``minipar.viz.cards``     glossary cards (EN/RU/ZH) a notebook opens with (text, no figure)

Figures are returned (``fig``), never shown, so they work headless (Agg).
"""
