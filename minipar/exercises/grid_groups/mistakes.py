"""Naming a wrong process grid: which mistake made these coordinates and groups.

EN grid mistakes · RU ошибки построения сетки · ZH 进程网格常见错误

Pure arithmetic on what every rank measured (no MPI), so each sentence is
tested in-process.  ``everyone[q]`` is rank q's record (see
:func:`minipar.exercises.grid_groups.grader.run_grid`): its ``coords``, the
world ranks of its communicator on each axis in the order of their rank in
it (``members``), which of its ``comm.Split`` calls made each
(``split_axes``, by call), and what an all-reduce of one-hot vectors over
each summed (``reduced``).  The reference is minipar's
:class:`~minipar.comm.topology.Layout`: rank = ((d·pp + p)·cp + c)·tp + t.
Named, in this order (the first that explains what was measured wins):

* **Split called in a different order on different ranks** -- the k-th
  ``comm.Split`` of every rank is one collective call, so it made the tp
  group on some ranks and the dp group on others;
* **another axis order** -- coordinates (or groups) that are those of the
  grid with the axes in another order, e.g. tp outermost: then a
  tensor-parallel group is ranks far apart, not adjacent ones (for groups
  under right coordinates this comes last: swapping two axes' groups *is*
  another order, better said as "a group over the wrong axis");
* **colour and key swapped** -- ``Split(coord, group)``: the group holds the
  ranks that share my coordinate on the axis (all the other axes vary);
* **one colour for two axes** -- two axes' communicators hold the same ranks;
* **a group over the wrong axis** -- comms["tp"] holds my pp group;
* **the right ranks in the wrong order** -- the key is not the coordinate.
"""

from __future__ import annotations

from itertools import permutations

from minipar.comm.topology import AXES, Layout

LETTER = {"dp": "d", "pp": "p", "cp": "c", "tp": "t"}
Record = dict  # one rank's measurements (see the module docstring)


def layout(sizes: dict[str, int]) -> Layout:
    return Layout(**{a: sizes[a] for a in AXES})


def coords(sizes: dict[str, int], rank: int) -> dict[str, int]:
    """minipar's coordinates of ``rank`` (dp, pp, cp, tp only)."""
    co = layout(sizes).coords(rank)
    return {a: co[a] for a in AXES}


def used_axes(sizes: dict[str, int]) -> tuple[str, ...]:
    """The axes of more than one rank, outermost first (size-1 axes change nothing)."""
    return tuple(a for a in AXES if sizes[a] > 1)


def coords_in(order: tuple[str, ...], sizes: dict[str, int], rank: int) -> dict[str, int]:
    """Coordinates of ``rank`` in the grid whose axes are ``order``, outermost first."""
    out = dict.fromkeys(AXES, 0)
    for a in reversed(order):
        rank, out[a] = divmod(rank, sizes[a])
    return out


def group_in(order: tuple[str, ...], sizes: dict[str, int], rank: int, axis: str) -> list[int]:
    """The ranks that differ from ``rank`` only on ``axis``, in the grid ordered ``order``."""
    co = coords_in(order, sizes, rank)
    found = []
    for i in range(sizes[axis]):
        c, r = {**co, axis: i}, 0
        for a in order:
            r = r * sizes[a] + c[a]
        found.append(r)
    return found


def formula(order: tuple[str, ...]) -> str:
    """``rank = ((d·pp + p)·cp + c)·tp + t`` for the axes ``order``, outermost first."""
    if not order:
        return "rank = 0"
    expr = LETTER[order[0]]
    for a in order[1:]:
        expr = f"({expr})" if "+" in expr else expr
        expr = f"{expr}·{a} + {LETTER[a]}"
    return f"rank = {expr}"


def other_order(sizes: dict[str, int], fits) -> tuple[str, ...] | None:
    """The first order of the used axes, not minipar's, for which ``fits(order)`` holds."""
    used = used_axes(sizes)
    return next((o for o in permutations(used) if o != used and fits(o)), None)


def _order_words(order: tuple[str, ...], sizes: dict[str, int]) -> str:
    used = used_axes(sizes)
    return (f"are, on every rank, those of the grid with the axes in the order {', '.join(order)} "
            f"(outermost first; {formula(order)}). minipar (Megatron-LM) orders them "
            f"{', '.join(used)}: {formula(used)}, tp innermost, so a tensor-parallel group is "
            "ADJACENT ranks (one server's fast links: tp talks in every layer) and dp, which "
            "talks once a step, is outermost.")


def ranks_words(ranks: list[int]) -> str:
    return "[" + ", ".join(map(str, ranks)) + "]"


def coords_mistake(sizes: dict[str, int], rank: int, everyone: list[Record]) -> str:
    """Why rank ``rank``'s coordinates are not the Layout's, in a sentence."""
    got, want = everyone[rank]["coords"], coords(sizes, rank)
    said = (f"rank {rank}: your coordinates {_co(got)}, the Layout's {_co(want)} "
            f"({formula(used_axes(sizes)) if used_axes(sizes) else 'rank = 0'}).")
    if all(r.get("coords") is not None for r in everyone):
        order = other_order(sizes, lambda o: all(
            {a: r["coords"][a] for a in AXES} == coords_in(o, sizes, q)
            for q, r in enumerate(everyone)))
        if order:
            return f"{said} Your coordinates {_order_words(order, sizes)}"
    return (f"{said} Peel the digits off your rank, tp first: t = rank % tp, then "
            "rank //= tp; c = rank % cp, ...; dp is what is left.")


def _co(co: dict) -> str:
    return "{" + ", ".join(f"{a} {co.get(a)}" for a in AXES) + "}"


def split_order(everyone: list[Record]) -> str | None:
    """The Split call that made different axes' communicators on different ranks, or None."""
    calls = max((len(r.get("split_axes") or []) for r in everyone), default=0)
    for i in range(calls):
        made: dict[str | None, list[int]] = {}
        for q, r in enumerate(everyone):
            axes = r.get("split_axes") or []
            made.setdefault(axes[i] if i < len(axes) else None, []).append(q)
        if len(made) > 1:
            said = " but ".join(
                (f"comms[{a!r}]" if a else "no communicator you returned")
                + f" on ranks {', '.join(map(str, qs))}" for a, qs in made.items())
            return (f"Split call #{i + 1} made {said}. Split is collective: the k-th call of "
                    "every rank is ONE call, and ranks that give colours of different axes "
                    "get mixed groups. Split for the axes in the same order on every rank "
                    "(one fixed loop over dp, pp, cp, tp).")
    return None


def members_mistake(sizes: dict[str, int], rank: int, axis: str,
                    everyone: list[Record]) -> tuple[str, bool]:
    """Why comms[axis] on rank ``rank`` holds the wrong ranks, in a sentence; and whether
    a usual mistake was named (else the sentence only states what is wrong)."""
    lay = layout(sizes)
    me = everyone[rank]
    got, want = me["members"][axis], lay.ranks(rank, axis)
    others = [a for a in AXES if a != axis]
    said = (f"rank {rank}: comms[{axis!r}] holds ranks {ranks_words(got)} ({len(got)}); its "
            f"{axis} group is {ranks_words(want)} ({sizes[axis]}: the ranks that share your "
            f"{', '.join(others[:-1])} and {others[-1]} coordinates).")
    why = split_order(everyone)
    if why:
        return f"{said} {why}", True
    order = _groups_order(sizes, everyone)
    if order and all(r.get("coords") == coords_in(order, sizes, q)  # coordinates alike
                     for q, r in enumerate(everyone)):
        return f"{said} Your groups {_order_words(order, sizes)}", True
    mine = coords(sizes, rank)[axis]
    same = [q for q in range(lay.world) if coords(sizes, q)[axis] == mine]
    if set(got) == set(same):
        why = (f"These are the ranks whose {axis} coordinate equals yours ({mine}): colour "
               "and key swapped. The colour says WHO is in the group (the ranks that share "
               "every other coordinate: e.g. the group's first rank, rank - "
               f"{axis}·stride); the key only says the ORDER in it (your {axis} coordinate).")
        return f"{said} {why}", True
    if len(got) == 1:  # a group of one is every size-1 axis's group: it names nothing
        return said, False
    twin = next((b for b in others if set(me["members"][b]) == set(got)
                 and set(got) == set(lay.ranks(rank, b))), None)
    if twin:
        return (f"{said} comms[{axis!r}] and comms[{twin!r}] hold the same ranks, your {twin} "
                f"group: one colour used for two axes. Each axis needs its own colour: the "
                "ranks that share every coordinate except that axis's."), True
    wrong = next((b for b in others if set(lay.ranks(rank, b)) == set(got)), None)
    if wrong:
        return (f"{said} That is your {wrong} group: a group over the wrong axis (the colour "
                f"of comms[{axis!r}] must vary with every coordinate but {axis}'s)."), True
    if order:
        return f"{said} Your groups {_order_words(order, sizes)}", True
    return said, False


def _groups_order(sizes: dict[str, int], everyone: list[Record]) -> tuple[str, ...] | None:
    """Another axis order whose groups are every rank's groups, or None."""
    if not all(r.get("members") for r in everyone):
        return None
    return other_order(sizes, lambda o: all(
        set(r["members"][a]) == set(group_in(o, sizes, q, a))
        for q, r in enumerate(everyone) for a in AXES))


def order_mistake(sizes: dict[str, int], rank: int, axis: str, everyone: list[Record]) -> str:
    """comms[axis] holds the right ranks in the wrong order, in a sentence."""
    got, want = everyone[rank]["members"][axis], layout(sizes).ranks(rank, axis)
    return (f"rank {rank}: comms[{axis!r}] holds the right ranks in the wrong order: by their "
            f"rank in it {ranks_words(got)}, by {axis} coordinate {ranks_words(want)}. Split "
            f"orders a group by key (ties by the parent's rank): key = your {axis} coordinate "
            "makes your rank in the communicator your coordinate.")


def reduce_mistake(sizes: dict[str, int], rank: int, axis: str, everyone: list[Record]) -> str:
    """An all-reduce over comms[axis] that did not sum exactly its group, in a sentence."""
    got, want = everyone[rank]["reduced"][axis], sorted(layout(sizes).ranks(rank, axis))
    if got is None:
        return (f"rank {rank}: comms[{axis!r}] was not made by comm.Split on the communicator "
                "you were given, so the grader cannot all-reduce over it (it all-reduces over "
                "the communicators your Split calls made, in the order you made them). Make "
                "every group with comm.Split(color, key).")
    return (f"rank {rank}: an all-reduce over comms[{axis!r}] summed the contributions of ranks "
            f"{ranks_words(got)}; its {axis} group is {ranks_words(want)}.")


def findings(sizes: dict[str, int], rank: int, everyone: list[Record]) -> dict[str, str]:
    """Every problem of rank ``rank``'s answer, by check: contract, coords, members, order,
    allreduce (the first axis with each; an empty dict when all is right)."""
    me = everyone[rank]
    if me.get("contract"):
        return {"contract": me["contract"]}
    found: dict[str, str] = {}
    if me["coords"] != coords(sizes, rank):
        found["coords"] = coords_mistake(sizes, rank, everyone)
    lay = layout(sizes)
    wrong = []  # (named?, sentence) of each axis whose group is wrong
    for a in AXES:
        got, want = me["members"][a], lay.ranks(rank, a)
        if sorted(got) != sorted(want):
            said, named = members_mistake(sizes, rank, a, everyone)
            wrong.append((not named, said))
        elif got != want:
            found.setdefault("order", order_mistake(sizes, rank, a, everyone))
        if me["reduced"][a] != sorted(want):
            found.setdefault("allreduce", reduce_mistake(sizes, rank, a, everyone))
    if wrong:  # a named mistake first, else the first axis
        found["members"] = min(wrong, key=lambda w: w[0])[1]
    return dict(sorted(found.items(), key=lambda kv: list(KEYS).index(kv[0])))


#: the checks, in the report's order
KEYS = ("contract", "coords", "members", "order", "allreduce")
