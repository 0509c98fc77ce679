"""Times that break their layer's trend are flagged; real trends (overhead, then n², a cubic
tail, a faster case) are not. Times are constructed, not measured."""

from __future__ import annotations

import io

import pandas as pd
from rich.console import Console

from attnbench.cli.summary import summary_notes, summary_tables
from attnbench.fits.outliers import TREND_FACTOR, trend_outliers
from attnbench.results.run import RunResults
from attnbench.schema import RESULT_COLUMNS

NS = (64, 128, 256, 512, 1024)


def frame(times: dict[tuple[str, int, int], float]) -> pd.DataFrame:
    rows = [
        {"case_id": f"{layer}/n={n}/d={d}/b=1/float32/cpu/forward", "layer": layer, "n": n,
         "d": d, "status": "ok", "time_s": t}
        for (layer, n, d), t in times.items()
    ]  # fmt: skip
    return pd.DataFrame(rows)


def attention(n: int, d: int = 64) -> float:
    """Overhead, then n² d: flat at small n, quadratic at large n."""
    return 50e-6 + 2e-11 * n * n * d


def test_a_case_slowed_by_a_burst_is_flagged_against_its_larger_neighbour() -> None:
    times = {("attention", n, 64): attention(n) for n in NS}
    times[("attention", 256, 64)] *= 400  # 52 ms where its trend says ~130 µs
    found = trend_outliers(frame(times))
    assert list(found["case_id"]) == ["attention/n=256/d=64/b=1/float32/cpu/forward"]
    row = found.iloc[0]
    assert row["along"] == "n" and row["bound_s"] == attention(1024)  # the slower of the next two
    assert row["ratio"] == 400 * attention(256) / attention(1024)


def test_real_trends_are_not_flagged() -> None:
    times = {("attention", n, d): attention(n, d) for n in NS for d in (32, 64, 128)}
    times.update({("rnn", n, 64): 1e-3 + 1e-7 * n for n in NS})  # all overhead: flat
    times.update({("cubic", n, 64): 1e-12 * n**3 for n in NS})  # the steepest law allowed
    # Faster than its trend: not flagged (load slows cases, never speeds one), and its smaller
    # neighbour is compared with the slowest larger case, so the dip does not flag it either.
    times[("rnn", 512, 64)] /= 10
    times.update({("gru", n, 64): 1e-3 for n in NS})
    times[("gru", 128, 64)] = 1e-3 * TREND_FACTOR * 0.99  # just under the factor
    assert trend_outliers(frame(times)).empty
    times[("gru", 128, 64)] = 1e-3 * TREND_FACTOR * 1.01  # just over
    assert list(trend_outliers(frame(times))["layer"]) == ["gru"]


def test_the_largest_case_is_bounded_by_cubic_growth_and_widths_by_theirs() -> None:
    times = {("attention", n, 64): attention(n) for n in NS}
    times[("attention", 1024, 64)] = attention(512) * 8 * 20  # 20x past cubic growth from 512
    times.update({("rnn", 256, d): 1e-8 * 256 * d * d for d in (32, 64, 128)})
    times[("rnn", 256, 32)] *= 200  # the narrowest width slower than the widest: along d
    found = trend_outliers(frame(times)).set_index("layer")
    cubic = max(attention(512) * 2**3, attention(256) * 4**3)  # the slower of the two below
    assert found.loc["attention", "along"] == "n"
    assert found.loc["attention", "ratio"] == attention(512) * 8 * 20 / cubic
    assert found.loc["rnn", "along"] == "d" and found.loc["rnn", "n"] == 256
    single = frame({("conv", 64, 64): 1.0})
    assert trend_outliers(single).empty  # one size: no trend to break


def test_the_summary_marks_the_case_and_says_what_to_do(tmp_path) -> None:  # type: ignore[no-untyped-def]
    times = {("attention", n, 64): attention(n) for n in NS}
    times[("attention", 256, 64)] *= 400
    rows = frame(times).reindex(columns=RESULT_COLUMNS)
    rows["path_len_method"] = ""
    rows["device_name"] = "a cpu"
    rows["time_iqr_s"] = 0.0  # tight samples: the IQR mark cannot see it
    samples = pd.DataFrame(columns=["case_id", "round", "load_1m"])
    run = RunResults(tmp_path, rows, samples, {"cases_total": len(rows)})
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, color_system=None)
    summary_tables(run, console)
    summary_notes(run, console)
    text = buffer.getvalue()
    marked = [line for line in text.splitlines() if "^" in line and "│" in line]
    assert len(marked) == 1 and marked[0].startswith("│  256 │ 64 │ 53.6 ms ^")
    note = " ".join(text.split())
    assert "1 case(s) marked ^ are over 5x slower than their layer's trend" in note
    assert "worst attention n=256 d=64, 38x" in note and "More --processes" in note
