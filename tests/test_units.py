"""The number formats of the tables: what a reader sees of a count or a rate."""

from __future__ import annotations

import math

from attnbench.units import fmt_count


def test_a_count_is_rounded_before_its_prefix_is_chosen() -> None:
    """999.6 M FLOP/s read "1e+03 M" in a new user's table: rounded to three digits first, it
    is "1 G"."""
    assert fmt_count(999.6e6) == "1 G" and fmt_count(999.7) == "1 k"
    assert fmt_count(1.5e9, "FLOP/s") == "1.5 GFLOP/s" and fmt_count(12_345) == "12.3 k"
    assert fmt_count(998.4e6) == "998 M" and fmt_count(0.5) == "0.5"
    assert fmt_count(-2.5e6) == "-2.5 M"
    assert fmt_count(None) == "-" and fmt_count(math.nan) == "-"


def test_the_tasks_runnable_now_leave_out_the_process_that_reads_them(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """/proc/loadavg's fourth field counts the running tasks, the reader among them."""
    import builtins

    from attnbench import devices

    looks = iter(["2.0 1.0 0.5 4/200 99\n", "2.0 1.0 0.5 1/200 99\n", "2.0 1.0 0.5 3/200 99\n"])
    real_open = builtins.open

    def fake_open(path, *args, **kwargs):  # type: ignore[no-untyped-def]
        if str(path) == "/proc/loadavg":
            (tmp_path / "l").write_text(next(looks))
            return real_open(tmp_path / "l", *args, **kwargs)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    assert devices.runnable_now(looks=3, every_s=0.0) == 2.0  # median of 3, 0, 2
    monkeypatch.setattr(builtins, "open", lambda *a, **k: (_ for _ in ()).throw(OSError()))
    assert devices.runnable_now(looks=2, every_s=0.0) is None
