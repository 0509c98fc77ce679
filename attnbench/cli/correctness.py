"""The correctness checks' notes in the summary: decoded tokens and compiled outputs against
their tolerance, each layer's largest difference, compiled cases that ran eager, and cases
whose time is a fused kernel's (a compiled call's, or a module's fast path)."""

from __future__ import annotations

import pandas as pd

from attnbench.devices import tolerance
from attnbench.measure.counts.ops import ATTENTION_FAST_PATHS, fused_names
from attnbench.schema import Status, failed_a_check, numeric_column

# The correctness checks a case may carry: its column, what it compares, and whether its
# tolerance is the device's (decoded tokens: TF32's where cuDNN may round through it) or the
# dtype's alone (a compiled output: ``measure.compiled`` grants TF32 nothing).
_CHECKS = (
    ("decode_check", "decoded tokens against the causal layer's parallel output", True),
    ("compile_check", "compiled outputs against the eager layer's", False),
)


def correctness_notes(frame: pd.DataFrame) -> list[str]:
    """Each layer's correctness checks: the largest difference (relative) in its cases that
    passed, beside what the dtype allows, and the layers with cases that failed (a difference
    past it, or none that could be read: a NaN output). A compiled case that compiled no graph
    ran eager: its check compares the layer with itself and is not counted."""
    notes = []
    failed = frame["status"] == Status.FAILED
    measured = (frame["status"] == Status.OK) | failed_a_check(frame)
    eager = numeric_column(frame, "compile_graphs") == 0
    for column, what, on_device in _CHECKS:
        values = numeric_column(frame, column)
        if not values.notna().any():
            continue  # no case of this run took the check
        taken = measured & (values.notna() | failed) & frame["dtype"].notna()
        if column == "compile_check":
            taken &= ~eager
        rows = frame[taken]
        if not len(rows):
            continue
        where = [(str(r.dtype), str(r.device) if on_device else "cpu") for r in rows.itertuples()]
        allowed = pd.Series([tolerance(*w) for w in where], index=rows.index)
        passed = values[rows.index] <= allowed  # NaN: not passed
        layers = list(dict.fromkeys(rows["layer"]))
        good = values[rows.index][passed].groupby(rows["layer"][passed]).max()
        text = f"{what}, the largest difference (relative) in each layer's cases that passed: "
        text += ", ".join(f"{x} {good[x]:.2g}" for x in layers if x in good.index) or "none"
        allows = [
            f"{dtype}{f' on {device}' if on_device else ''} allows {tolerance(dtype, device):g}"
            for dtype, device in dict.fromkeys(where)
        ]
        text += f" ({', '.join(allows)})"
        bad = [x for x in layers if not passed[rows["layer"] == x].all()]
        if bad:
            text += f"; {int((~passed).sum())} case(s) failed it ({', '.join(bad)}): their "
            text += "errors say by how much"
        notes.append(text)
    return notes


def compile_notes(frame: pd.DataFrame) -> list[str]:
    """Compiled cases whose graph broke, those that compiled no graph at all (they ran eager,
    so their time is the eager layer's), and those whose call took a fused path."""
    return [*_counted_eager(frame), *_broken_graphs(frame), *_fused_when_compiled(frame)]


def _counted_eager(frame: pd.DataFrame) -> list[str]:
    """Which columns of a compiled case are the compiled call's and which the eager layer's
    (``measure.case``: dynamo would trace a dispatch mode around the compiled call, so the
    counts are taken on the eager layer): a compiled attention's peak read 85.5 KiB beside
    results.csv's kernels column, which lists the eager layer's five ops, their bytes and a
    peak-sized softmax, and the table did not say the two describe different calls."""
    if "compiled" not in frame.columns:
        return []
    compiled = frame["compiled"].notna() & (frame["compiled"].astype(str).str.len() > 0)
    if not (compiled & (frame["status"] == Status.OK)).any():
        return []
    return [
        "a compiled case's time, kernels' share and peak memory are the compiled call's; its "
        "FLOPs, elementwise work, bytes, steps and path (and results.csv's kernels and ops) are "
        "counted on the eager layer, what the layer computes, not the kernels inductor "
        "generated: a fused kernel moves fewer bytes and holds less at its peak than they say"
    ]


def _fused_when_compiled(frame: pd.DataFrame) -> list[str]:
    """Compiled cases whose timed call ran one of torch's fused kernels (``fused_path``):
    inductor calls such an op as it is, so the case times that kernel, not code it generated
    (an ``nn.TransformerEncoderLayer`` in eval mode compiled to its fast path's one op, and its
    output matched the eager layer's to the bit)."""
    if "fused_path" not in frame.columns or "compiled" not in frame.columns:
        return []
    compiled = frame["compiled"].notna() & (frame["compiled"].astype(str).str.len() > 0)
    fused = frame["fused_path"].astype(str)
    taken = frame[compiled & frame["fused_path"].notna() & (fused.str.len() > 0)]
    if not len(taken):
        return []
    paths = dict.fromkeys(f"{layer}: {fused[i]}" for i, layer in taken["layer"].items())
    return [
        f"{len(taken)} compiled case(s) ran a fused kernel of torch's ({'; '.join(paths)}): "
        "inductor calls it as it is, so their time is that kernel's (with the compiled "
        "call's own overhead), not code inductor generated"
    ]


def fast_path_notes(frame: pd.DataFrame) -> list[str]:
    """Eager cases whose call took a module's fast path (``ATTENTION_FAST_PATHS``): in eval
    mode without grad, ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` run one
    fused op in place of their Python forward, so the time is that op's (a new user's
    ``nn.TransformerEncoderLayer`` said so only in the ``fused_path`` column)."""
    if "fused_path" not in frame.columns:
        return []
    compiled = frame.get("compiled", pd.Series(None, index=frame.index))
    eager = compiled.isna() | (compiled.astype(str).str.len() == 0)
    paths = frame["fused_path"].map(lambda text: text if isinstance(text, str) else "")
    fast = paths.map(lambda text: bool(fused_names(text) & ATTENTION_FAST_PATHS))
    taken = frame[eager & fast & (frame["status"] == Status.OK)]
    if not len(taken):
        return []
    names = dict.fromkeys(
        f"{layer}: {name}"
        for layer, text in zip(taken["layer"], paths[taken.index], strict=True)
        for name in sorted(fused_names(text) & ATTENTION_FAST_PATHS)
    )
    return [
        f"{len(taken)} case(s) took a module's fast path ({'; '.join(names)}): in eval mode "
        "without grad torch runs that one fused op in place of the module's Python forward, so "
        "their time is its kernel's; --mode train takes the module's own ops"
    ]


def _broken_graphs(frame: pd.DataFrame) -> list[str]:
    """Compiled cases whose graph broke, and those that compiled no graph at all."""
    graphs = numeric_column(frame, "compile_graphs")
    breaks = numeric_column(frame, "compile_breaks")
    broke = frame[(breaks > 0) | (graphs == 0)]
    if not len(broke):
        return []
    reasons = broke.get("compile_break_reasons", pd.Series("", index=broke.index)).map(
        lambda reason: reason if isinstance(reason, str) else ""
    )
    first = {
        layer: str(reason).split("; ")[0]
        for layer, reason in zip(broke["layer"], reasons, strict=True)
        if str(reason)
    }
    eager = sorted(set(broke.loc[graphs[broke.index] == 0, "layer"]))
    note = f"{len(broke)} compiled case(s) broke their graph ("
    note += "; ".join(f"{layer}: {why}" for layer, why in first.items()) or "no reason kept"
    note += "); see compile_breaks and compile_break_reasons"
    if eager:
        note += (
            f"; {', '.join(eager)} compiled no graph at all and ran eager: those times are the "
            "eager layer's"
        )
    return [note]
