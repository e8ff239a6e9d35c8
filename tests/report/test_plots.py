"""Plots draw strings from the trace literally: a char[] value or a name holding ``$…$``
is not read as matplotlib mathtext."""

from ctracer.event import Field, Layout
from ctracer.report import plots

MINI = Layout.packed_in_order("ctracer__mini_t", [Field("name", "char[16]", 0, "text")])
TRAP = "$x^2$ \\frac"


def _texts(ax):
    fig = ax.figure
    return [t for t in fig.findobj(match=lambda a: hasattr(a, "_preprocess_math"))
            if t.get_text()]


def test_traced_text_is_drawn_literally(tmp_path):
    plots._init_worker(MINI.to_json())
    painter = plots._painter
    job = plots.FieldPlot(str(tmp_path / "name.png"), "name", f"name — {TRAP}",
                          [plots.Series(TRAP, [(0, "plain"), (1000, TRAP)], 2000),
                           plots.Series("$b$", [(0, "plain"), (500, "$$")], 2000)])
    painter.field_plot(job)
    assert (tmp_path / "name.png").stat().st_size > 0
    ax = next(iter(painter._canvases.values()))
    shown = {}
    for t in _texts(ax) + ax.get_yticklabels():
        text, is_math = t._preprocess_math(t.get_text())
        assert not is_math, t.get_text()
        shown[text] = True
    # the value, the legend label and the title all read as they were recorded
    assert "'$x^2$ \\\\frac'" in shown or "'$x^2$ \\frac'" in shown
    assert "$b$" in shown
    assert any(TRAP in text for text in shown)


def test_function_names_in_bar_plots_are_literal(tmp_path):
    plots._init_worker(MINI.to_json())
    painter = plots._painter
    painter.call_count_plot(plots.CallCountPlot(str(tmp_path / "c.png"), "calls $n$",
                                                [("f$a$", 3), ("g", 1)]))
    ax = next(a for key, a in painter._canvases.items() if key[1] != plots._LEFT_PX)
    labels = [t._preprocess_math(t.get_text()) for t in ax.get_yticklabels()]
    assert ("f$a$", False) in labels
    assert ax.title.get_text() and not ax.title._preprocess_math(ax.title.get_text())[1] \
        or not ax._left_title._preprocess_math(ax._left_title.get_text())[1]
