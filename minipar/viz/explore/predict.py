"""Predict, then measure: a learner's number beside a run on real local ranks and the formula.

EN predict then measure · RU предскажи, затем измерь · ZH 先预测再测量

Each :class:`Question` of :data:`QUESTIONS` names a small configuration, the formula's
answer (from :mod:`minipar.plan` or the explorers), the run that measures it (``minipar
run`` on local MPI ranks through :mod:`minipar.launch`, a few seconds), and the one
sentence on the usual mistake.  :func:`judge` is the verdict as text (tested);
:func:`ask` shows the question, and — with ipywidgets — a box for the prediction and a
button that runs the configuration and shows measured, predicted and formula side by
side.  Headless (nbconvert, the test suite) it shows the question and the command, and
runs nothing.  :func:`measure_model_states` is the memory explorer's "measure this"
(:func:`measure_this`: dp, tp, pp, cp and ZeRO of the small GPT on up to 4 local ranks).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minipar import launch
from minipar.plan.collectives import ring_allreduce_volume
from minipar.plan.model import gpt_param_breakdown
from minipar.plan.pipeline import bubble_formula
from minipar.viz.explore.memory import memory

TIMEOUT = 120.0
SMALL = "minipar run's GPT (2 × 16, float64)"
#: the same GPT in ``minipar run hybrid`` (whose own defaults are 4 layers, 4 heads, vocab 8)
HYBRID_SMALL = ("--layers", "2", "--heads", "2", "--vocab", "10", "--d-model", "16", "--seq",
                "8")


def run_summary(strategy: str, n: int, *options: str) -> dict[str, Any]:
    """``minipar run STRATEGY -n N OPTIONS`` on N local ranks: rank 0's summary (a dict)."""
    from minipar.run import SUMMARY_PREFIX, parse

    opts = parse([strategy, "-n", str(n), *options])
    summary, _ = launch.run_json(n, "minipar.run.worker", opts, timeout=TIMEOUT,
                                 prefix=SUMMARY_PREFIX, check=True)
    return summary


def measure_model_states(zero: int, n: int = 2, tp: int = 1, pp: int = 1,
                         cp: int = 1) -> float:
    """Model-state bytes one rank holds in a run of minipar run's GPT (float64), ``n``
    data-parallel ranks × ``tp`` × ``pp`` × ``cp`` (ZeRO-``zero`` over the dp·cp ranks):
    ``minipar run zero`` when tp = pp = cp = 1, else ``minipar run hybrid`` (the most any
    rank of the explorer's stage holds): what :func:`minipar.viz.explore.memory.memory`
    predicts for the small GPT."""
    if tp == pp == cp == 1:
        s = run_summary("zero", n, "--stage", str(zero), "--steps", "1")
        return float(s["model_state_bytes_per_rank"][0])
    s = run_summary("hybrid", n * tp * pp * cp, *measure_options(zero, n, tp, pp, cp))
    stage = _explorer(zero, n, tp, pp, cp).numbers["stage"]
    return float(max(b for b, c in zip(s["model_state_bytes_per_rank"], s["coords_per_rank"])
                     if c["pp"] == stage))


def measure_options(zero: int, n: int, tp: int, pp: int, cp: int = 1) -> list[str]:
    """The options of the run that measures a layout (:func:`measure_command`)."""
    if tp == pp == cp == 1:
        return ["--stage", str(zero), "--steps", "1"]
    return ["--dp", str(n), "--tp", str(tp), "--pp", str(pp), *(["--cp", str(cp)] if cp > 1
                                                                else []),
            "--zero", str(zero), *HYBRID_SMALL, "--steps", "1"]


def measure_command(zero: int, n: int = 2, tp: int = 1, pp: int = 1, cp: int = 1) -> str:
    """``minipar run zero|hybrid ...``: the command :func:`measure_model_states` runs."""
    what = "zero" if tp == pp == cp == 1 else "hybrid"
    return (f"minipar run {what} -n {n * tp * pp * cp} "
            + " ".join(measure_options(zero, n, tp, pp, cp)))


def _explorer(zero: int, n: int, tp: int, pp: int, cp: int = 1) -> Any:
    return memory(SMALL, dp=n, tp=tp, pp=pp, cp=cp, zero=zero, remat="none",
                  precision="float64", micro_batches=1)


def predicted_model_states(zero: int, n: int = 2, tp: int = 1, pp: int = 1,
                           cp: int = 1) -> float:
    """The memory explorer's params + grads + optimizer for the same run (per device, on
    the fuller of the first and last pipeline stage)."""
    v = _explorer(zero, n, tp, pp, cp)
    return v.numbers["params"] + v.numbers["grads"] + v.numbers["optimizer"]


def _ring_bytes() -> float:
    data, _ = launch.run_json(4, "minipar.cli.demo", {"elems": 3000}, timeout=TIMEOUT,
                              check=True)
    return float(max(row["ring_sent"] for row in data["rows"]))


def _qwz_bytes() -> float:
    from minipar.parallel.zero.measure import zeropp_formula_bytes

    return zeropp_formula_bytes(7040, 4, 2, ("qwz",), 256, 8)["total"]


def _moe_states() -> float:
    b = gpt_param_breakdown(2, 16, 10, 8, n_experts=4)
    return 32.0 * (b["total"] - b["experts"] + b["experts"] / 2)


@dataclass(frozen=True)
class Question:
    """What to predict, its formula, the run that measures it, the usual mistake."""

    text: str
    unit: str
    formula: Callable[[], float]
    measure: Callable[[], float]
    command: str
    mistake: str
    rel_tol: float = 0.01
    measured_note: str = ""


QUESTIONS: dict[str, Question] = {
    "ring-bytes": Question(
        "A ring all-reduce of S = 24,000 bytes (3,000 float64) on N = 4 ranks: how many "
        "bytes does each rank send?", "B", lambda: ring_allreduce_volume(24_000, 4),
        _ring_bytes, "minipar demo -n 4 (3,000 elements)",
        "The usual mistake is 2S (reduce, then broadcast the whole buffer) or S: each rank "
        "sends one chunk of S/N at each of the 2(N − 1) steps, 2(N − 1)/N × S in all."),
    "dp-bytes": Question(
        "Data parallelism on N = 2 ranks, minipar run's GPT: Ψ = 7,040 float64 parameters. "
        "How many bytes does each rank send per step for the gradients?", "B",
        lambda: ring_allreduce_volume(7040 * 8, 2),
        lambda: run_summary("dp", 2, "--steps", "1")["bytes_sent_per_rank"][0],
        "minipar run dp -n 2 --steps 1",
        "The usual mistakes: 4 bytes per parameter (minipar's runs are float64: 8), or 2S "
        "(reduce then broadcast): an all-reduce sends 2(N − 1)/N × S, exactly S on 2 ranks."),
    "zero-memory": Question(
        "ZeRO-3 on N = 2 ranks, the same Ψ = 7,040 float64 parameters with Adam: how many "
        "bytes of model states (parameters, gradients, optimizer) does one rank hold?", "B",
        lambda: predicted_model_states(3, 2), lambda: measure_model_states(3, 2),
        "minipar run zero --stage 3 -n 2 --steps 1",
        "The usual mistakes: the paper's 16 bytes per parameter (that is mixed precision; "
        "float64 Adam is 8 + 8 + 16 = 32), or dividing only the optimizer states (stage 1): "
        "stage 3 divides all three by N."),
    "qwz-bytes": Question(
        "ZeRO++'s qwZ on N = 4 ranks (nodes of 2), minipar run's GPT: Ψ = 7,040 float64 "
        "parameters, INT8 blocks of 256 with one float64 scale each. How many bytes does "
        "each rank send per step (both weight all-gathers and the gradients' "
        "reduce-scatter)?", "B", _qwz_bytes,
        lambda: run_summary("zero", 4, "--stage", "3", "--node", "2", "--zeropp", "qwz",
                            "--steps", "1")["zeropp"]["bytes_per_rank"][0],
        "minipar run zero --stage 3 -n 4 --node 2 --zeropp qwz --steps 1",
        "The usual mistake is 3Ψ(N − 1)/N at 1 byte, or ZeRO-3's 3Ψ(N − 1)/N × 8 halved: "
        "qwZ quantizes only the two weight all-gathers (1 byte + 8/256 for the scales); "
        "the gradients' reduce-scatter stays float64, Ψ(N − 1)/N × 8.",
        measured_note="each rank's shards are cut into blocks of 256: a few scales more "
        "than the formula's Ψ/256"),
    "tp-bytes": Question(
        "Tensor parallelism, t = 2, minipar run's GPT (L = 2 blocks, b = 10 rows, s = 8, "
        "h = 16, float64): how many bytes does each rank send per step in the blocks' f "
        "and g?", "B", lambda: 4 * 2 * ring_allreduce_volume(10 * 8 * 16 * 8, 2),
        lambda: run_summary("tp", 2, "--steps", "1")["bytes_sent_per_rank"][0],
        "minipar run tp -n 2 --steps 1",
        "The usual mistake is counting the forward's two all-reduces per block only: "
        "backward adds two more (f's), 4 per block of b·s·h elements, each 2(t − 1)/t of it."),
    "bubble": Question(
        "1F1B on p = 2 stages with m = 4 micro-batches: what share of the step is the "
        "bubble (idle)?", "", lambda: float(bubble_formula("1f1b", 2, 4)["fraction"]),
        lambda: run_summary("pp", 2, "--steps", "1")["bubble_measured"]["rebuilt_median"],
        "minipar run pp -n 2 --steps 1 (1F1B, m = 4)",
        "The usual mistake is (p − 1)/m = 0.25: that is the bubble over the ideal time; "
        "the idle share of the step is (p − 1)/(m + p − 1).", rel_tol=0.05,
        measured_note="the measured bubble is rebuilt from each instruction's median cost; "
        "a tiny model's per-instruction overheads (and shared cores) make it larger"),
    "moe-memory": Question(
        "Expert parallelism, ep = 2, minipar run's GPT with 4 experts per block: 19,936 "
        "parameters, 17,024 of them in the experts; float64 Adam (32 bytes a parameter). "
        "How many bytes of model states does one rank hold?", "B", _moe_states,
        lambda: run_summary("ep", 2, "--experts", "4", "--steps", "1")[
            "model_state_bytes_per_rank"][0],
        "minipar run ep -n 2 --experts 4 --steps 1",
        "The usual mistake is dividing the whole model by ep: only the experts are split; "
        "attention, embeddings, router and head are replicated on every rank."),
}


def judge(prediction: float | None, measured: float, formula: float, rel_tol: float,
          mistake: str, unit: str = "", note: str = "") -> list[str]:
    """The verdict: measured, formula and the prediction, right when within ``rel_tol``
    of the formula, else the usual mistake."""
    def fmt(x: float) -> str:
        return f"{x:,.0f} {unit}".strip() if abs(x) >= 100 else f"{x:.3f} {unit}".strip()

    lines = [f"measured on real ranks: {fmt(measured)}" + (f" ({note})" if note else ""),
             f"formula: {fmt(formula)}"]
    if prediction is None:
        return lines + ["no prediction typed: predict first, then measure"]
    right = abs(prediction - formula) <= rel_tol * max(abs(formula), 1e-12)
    lines.append(f"your prediction: {fmt(prediction)} — "
                 + ("right." if right else f"not quite. {mistake}"))
    return lines


def parse_number(text: str) -> float | None:
    """A typed prediction: ``56320``, ``56,320``, ``5.6e4``, ``0.2``; None when empty or not
    a number."""
    try:
        return float(str(text).replace(",", "").replace("_", "").strip())
    except ValueError:
        return None


def ask(key: str) -> Question:
    """Show question ``key``; with ipywidgets a prediction box and a measure button."""
    from IPython.display import Markdown, Pretty, display

    q = QUESTIONS[key]
    display(Markdown(f"**Predict, then measure.** {q.text}  \n*Runs:* `{q.command}`"))
    try:
        import ipywidgets as w
    except ImportError:
        display(Pretty("(install the notebooks extra for the prediction box and the button)"))
        return q
    box = w.Text(placeholder="your number", description=f"prediction {q.unit}".strip())
    button = w.Button(description="measure on real ranks", button_style="primary",
                      layout=w.Layout(width="auto"))
    box.add_class(f"minipar-predict-{key}")
    button.add_class(f"minipar-measure-{key}")
    display(w.HBox([box, button]))
    out = display(Pretty("type your prediction, then press the button"), display_id=True)

    def run(_b: Any) -> None:
        out.update(Pretty(f"running {q.command} ..."))
        try:
            measured = float(q.measure())
        except Exception as e:  # a failed launch: say it in one line, keep the notebook
            out.update(Pretty(f"the run failed: {str(e).splitlines()[0] if str(e) else e!r}"))
            return
        out.update(Pretty("\n".join(judge(parse_number(box.value), measured, q.formula(),
                                          q.rel_tol, q.mistake, q.unit, q.measured_note))))

    button.on_click(run)
    return q


#: the most local ranks "measure this" launches (a few seconds on 2 cores)
MEASURE_RANKS = 4


def measure_this(dp: int = 2, zero: int = 1, tp: int = 1, pp: int = 1, cp: int = 1) -> None:
    """The memory explorer's "measure this": for minipar run's small GPT (float64), the
    explorer's model states per rank at ``dp`` × ``tp`` × ``pp`` × ``cp`` ranks (at most
    :data:`MEASURE_RANKS`) and ZeRO stage ``zero`` over dp·cp; with ipywidgets, controls
    and a button that runs ``minipar run zero`` (tp = pp = cp = 1) or ``minipar run
    hybrid`` and shows both."""
    from IPython.display import Pretty, display

    def said(n: int, z: int, t: int, p: int, c: int) -> str:
        ranks = n * t * p * c
        if ranks > MEASURE_RANKS:
            return (f"dp {n} · tp {t} · pp {p} · cp {c} = {ranks} ranks: at most "
                    f"{MEASURE_RANKS} here; lower one of them")
        v = _explorer(z, n, t, p, c)
        where = f" (stage {v.numbers['stage']})" if p > 1 else ""
        return (f"memory explorer, {SMALL}, dp {n} · tp {t} · pp {p} · cp {c}, ZeRO-{z}: "
                f"model states {predicted_model_states(z, n, t, p, c):,.0f} B per rank{where}; "
                f"measure: {measure_command(z, n, t, p, c)}")
    try:
        import ipywidgets as w
    except ImportError:
        display(Pretty(said(dp, zero, tp, pp, cp)))
        return
    boxes = {"dp": w.Dropdown(options=[1, 2, 3, 4], value=dp, description="dp"),
             "tp": w.Dropdown(options=[1, 2], value=tp, description="tp"),
             "pp": w.Dropdown(options=[1, 2], value=pp, description="pp"),
             "cp": w.Dropdown(options=[1, 2], value=cp, description="cp"),
             "zero": w.Dropdown(options=[0, 1, 2, 3], value=zero, description="zero")}
    button = w.Button(description="measure this", button_style="primary",
                      layout=w.Layout(width="auto"))
    button.add_class("minipar-measure-this")
    display(w.HBox([*boxes.values(), button]))
    out = display(Pretty(said(dp, zero, tp, pp, cp)), display_id=True)

    def values() -> tuple[int, int, int, int, int]:
        return tuple(boxes[k].value for k in ("dp", "zero", "tp", "pp", "cp"))
    for box in boxes.values():
        box.observe(lambda _c: out.update(Pretty(said(*values()))), "value")

    def run(_b: Any) -> None:
        n, z, t, p, c = values()
        if n * t * p * c > MEASURE_RANKS:
            return out.update(Pretty(said(n, z, t, p, c)))
        out.update(Pretty(said(n, z, t, p, c) + "\nrunning ..."))
        try:
            got = measure_model_states(z, n, t, p, c)
        except Exception as e:  # a failed launch: one line
            out.update(Pretty(f"the run failed: {str(e).splitlines()[0] if str(e) else e!r}"))
            return
        want = predicted_model_states(z, n, t, p, c)
        out.update(Pretty(said(n, z, t, p, c) + f"\nmeasured on {n * t * p * c} real ranks: "
                          f"{got:,.0f} B per rank " + (
                              "= the explorer's" if got == want else f"≠ the explorer's "
                              f"{want:,.0f} B ({got / want - 1:+.2%})")))

    button.on_click(run)
