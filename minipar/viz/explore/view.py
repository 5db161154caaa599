"""What an explorer returns, how a notebook shows it, and the thin widget around it.

EN explorer view and widgets · RU вид и элементы управления · ZH 视图与控件

:class:`View` is numbers (a dict), lines (what a learner reads) and a figure.
:func:`show` draws it headless (text and a PNG, so nbconvert and a static viewer see
it); :func:`explore` shows the default view, then — where ipywidgets is installed —
one control per entry of ``controls`` that redraws the same two outputs in place
(``display_id``), so a notebook is never blank without a widget front-end and never
shows the view twice with one.  A control is a tuple of choices (a dropdown), a
``range`` of whole numbers (a slider), a bool (a checkbox), or ``(lo, hi, step)`` of
floats (a slider).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from matplotlib.figure import Figure


@dataclass
class View:
    """An explorer's answer: ``numbers`` (plain values), ``lines`` (text), and ``draw``,
    which makes the figure the first time :attr:`figure` is read (numbers alone cost no
    drawing)."""

    numbers: dict[str, Any]
    lines: list[str] = field(default_factory=list)
    draw: Callable[[], Figure] | None = None
    controls: dict[str, Any] = field(default_factory=dict)  # the widgets, where shown
    _figure: Figure | None = None

    @property
    def figure(self) -> Figure | None:
        if self._figure is None and self.draw is not None:
            self._figure = self.draw()
        return self._figure

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes (Agg: no display needed)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    return buf.getvalue()


def _outputs(view: View) -> tuple[Any, Any]:
    from IPython.display import Image, Pretty

    return Pretty(view.text), (Image(data=png(view.figure)) if view.figure else Pretty(""))


def _close(view: View) -> None:
    if view._figure is not None:
        import matplotlib.pyplot as plt

        plt.close(view.figure)


def show(view: View) -> View:
    """Display the view's lines and figure in a notebook; returns the view."""
    from IPython.display import display

    text, image = _outputs(view)
    display(text)
    display(image)
    _close(view)
    return view


def widget_for(name: str, spec: Any, value: Any) -> Any:
    """One ipywidgets control for an entry of CONTROLS (see the module docstring)."""
    import ipywidgets as w

    label = name.replace("_", " ")
    style = {"description_width": "initial"}
    if isinstance(spec, bool) or isinstance(value, bool):
        return w.Checkbox(value=bool(value), description=label, style=style)
    if isinstance(spec, range):
        return w.IntSlider(value=value, min=spec.start, max=spec.stop - 1, step=spec.step,
                           description=label, style=style, continuous_update=False)
    if isinstance(spec, tuple) and len(spec) == 3 and all(isinstance(x, float) for x in spec):
        return w.FloatSlider(value=value, min=spec[0], max=spec[1], step=spec[2],
                             description=label, style=style, continuous_update=False)
    return w.Dropdown(options=list(spec), value=value, description=label, style=style)


class _Again:
    """Where no notebook holds the output (a plain Python shell): show each update anew."""

    def update(self, obj: Any) -> None:
        from IPython.display import display

        display(obj)


def _handle(obj: Any) -> Any:
    """Display ``obj`` and return a handle whose ``update`` redraws it in place."""
    from IPython.display import display

    return display(obj, display_id=True) or _Again()


def explore(fn: Callable[..., View], controls: Mapping[str, Any], **values: Any) -> View:
    """Show ``fn(**values)`` (its defaults where not given); with ipywidgets, add one
    control per entry of ``controls`` that redraws the view in place.  A ValueError of
    ``fn`` (a layout that does not divide) replaces the lines with its one line."""
    from IPython.display import display

    view = fn(**values)
    text, image = _outputs(view)
    try:
        import ipywidgets as w
    except ImportError:  # no widget front-end: the default view alone
        display(text)
        display(image)
        _close(view)
        return view
    import inspect

    defaults = {k: p.default for k, p in inspect.signature(fn).parameters.items()}
    current = {**defaults, **values}
    boxes = {k: widget_for(k, spec, current[k]) for k, spec in controls.items()}
    for k, box in boxes.items():
        box.add_class(f"minipar-control-{k}")
    display(w.HBox(list(boxes.values()), layout=w.Layout(flex_flow="row wrap")))
    h_text, h_image = _handle(text), _handle(image)
    _close(view)

    def redraw(_change: Any = None) -> None:
        kwargs = {**values, **{k: b.value for k, b in boxes.items()}}
        try:
            new = fn(**kwargs)
        except ValueError as e:
            from IPython.display import Pretty

            h_text.update(Pretty(f"not a valid choice: {e}"))
            return
        t, i = _outputs(new)
        h_text.update(t)
        h_image.update(i)
        _close(new)

    for box in boxes.values():
        box.observe(redraw, "value")
    view.controls = boxes
    return view
