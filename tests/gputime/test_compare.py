"""`jupyter_gpu.compare`: speed-ups against a baseline, as a table."""

from __future__ import annotations

import IPython
import IPython.display
import pytest
from timing_results import XSS, single

from jupyter_gpu.gputime.compare import Comparison, compare


def test_speedups_are_baseline_median_over_median() -> None:
    table = Comparison([single("slow", 0.004), single("fast", 0.002), single("slower", 0.008)])
    assert table.speedups == pytest.approx([1.0, 2.0, 0.5])


def test_speedup_text() -> None:
    rows = Comparison([single("slow", 0.004), single("fast", 0.002), single("slower", 0.008)]).rows()
    assert [row[-1] for row in rows] == ["baseline", "2.00x faster", "2.00x slower"]


def test_other_baseline() -> None:
    table = Comparison([single("slow", 0.004), single("fast", 0.002)], baseline=1)
    assert table.speedups == pytest.approx([0.5, 1.0])
    assert [row[-1] for row in table.rows()] == ["2.00x slower", "baseline"]


def test_labels_default_to_result_labels() -> None:
    table = Comparison([single("eager", 0.004), single("compiled", 0.002)])
    assert table.labels == ["eager", "compiled"]
    assert [row[0] for row in table.rows()] == ["eager", "compiled"]


def test_given_labels_win() -> None:
    rows = Comparison([single("a"), single("b")], labels=["before", "after"]).rows()
    assert [row[0] for row in rows] == ["before", "after"]


@pytest.mark.parametrize(("arguments", "error", "message"), [
    ({"results": [single(), single()], "labels": ["only one"]}, ValueError, "1 labels for 2 results"),
    ({"results": [single(), single()], "baseline": 2}, ValueError, "baseline must be an index from 0 to 1"),
    ({"results": [single()], "baseline": -1}, ValueError, "baseline must be an index from 0 to 0"),
    ({"results": [single(), 0.5]}, TypeError, "not float"),
    ({"results": []}, ValueError, "at least one GpuTimeResult"),
])
def test_bad_comparison_raises(arguments: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        Comparison(**arguments)


def test_zero_median_baseline_does_not_crash() -> None:
    # A baseline too short for the clock (median 0) cannot give a ratio: the row shows "-", not an exception.
    rows = Comparison([single("noop", 0.0), single("work", 0.002)]).rows()
    assert rows[1][-1] == "-"


def test_comparison_text_table() -> None:
    text = str(Comparison([single("eager", 0.004), single("compiled", 0.002, gpu_times=[0.0015])]))
    lines = text.splitlines()
    assert lines[0].split() == ["median", "min", "IQR", "n", "GPU", "median", "speed-up"]
    assert lines[2].split()[0] == "eager" and lines[2].endswith("baseline")
    assert "1.50 ms" in lines[3] and lines[3].endswith("2.00x faster")


def test_comparison_html_escapes_labels() -> None:
    html = Comparison([single(), single()], labels=[XSS, "b"])._repr_html_()
    assert XSS not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_compare_outside_ipython_prints_table(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)  # another test module may have started a shell
    compare(single("eager", 0.004), single("compiled", 0.002))
    out = capsys.readouterr().out
    assert "eager" in out and "compiled" in out and "2.00x faster" in out


def test_compare_in_ipython_displays_table(monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[object] = []
    monkeypatch.setattr(IPython, "get_ipython", lambda: object())
    monkeypatch.setattr(IPython.display, "display", shown.append)
    compare(single("eager", 0.004), single("compiled", 0.002), labels=["a", "b"], baseline=1)
    [table] = shown
    assert isinstance(table, Comparison) and table.labels == ["a", "b"] and table.baseline == 1
