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
                          [plots.Series.of_points(TRAP, [(0, "plain"), (1000, TRAP)], 2000),
                           plots.Series.of_points("$b$", [(0, "plain"), (500, "$$")], 2000)])
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


def test_envelope_keeps_each_stretchs_first_last_lowest_and_highest():
    assert plots.envelope([3, 1, 2], 8) == [0, 1, 2]
    values = [(i * 7919) % 1000 for i in range(10_000)]
    values[4321], values[6789] = -5000, 5000
    kept = plots.envelope(values, 400)
    assert len(kept) <= 400 and kept == sorted(set(kept))
    assert kept[0] == 0 and kept[-1] == len(values) - 1
    assert 4321 in kept and 6789 in kept  # the lowest and highest of all
    for k in range(100):  # every stretch keeps its own extremes
        lo, hi = k * 100, (k + 1) * 100
        part = values[lo:hi]
        mine = [values[i] for i in kept if lo <= i < hi]
        assert min(mine) == min(part) and max(mine) == max(part)


def test_a_strip_plot_of_more_objects_than_strips_draws_every_nth(tmp_path, monkeypatch):
    """Beyond MAX_STRIPS objects a strip plot draws every n-th object's strip: here the
    drawn ones (every 5th) are all "kept" and the others "skipped", so the sampled image
    has no pixel of the skipped value's colour and the full one has."""
    from PIL import Image

    plots._init_worker(MINI.to_json())
    series = [plots.Series.of_points(f"o{i}", [(0, "kept" if i % 5 == 0 else "skipped")], 1000)
              for i in range(50)]

    def colours(name):
        plots._painter.strip_plot(plots.StripPlot(str(tmp_path / name), "name", "t", series))
        return set(Image.open(tmp_path / name).convert("RGB").getdata())

    every_one = colours("all.png")
    monkeypatch.setattr(plots, "MAX_STRIPS", 10)
    sampled = colours("sampled.png")
    assert every_one - sampled  # the skipped value's colour is gone


def test_a_duration_plot_of_arrays_is_the_plot_of_lists(tmp_path, monkeypatch):
    """A method's durations reach the plot as the analysis' arrays (a list of millions
    of ints was a helper's biggest allocation): same dots, same median in the title."""
    import numpy as np

    monkeypatch.setattr(plots, "MAX_DOTS", 50)
    plots._init_worker(MINI.to_json())
    painter = plots._painter
    rng = np.random.default_rng(3)
    durations = rng.integers(0, 90_000, 301)
    times = np.cumsum(rng.integers(1, 5_000, 301))
    titles = []
    for name, make in (("lists", list), ("arrays", np.asarray)):
        painter.duration_plot(plots.DurationPlot(str(tmp_path / f"{name}.png"), "f: 301",
                                                 make(times.tolist()), make(durations.tolist())))
        ax = next(iter(painter._canvases.values()))
        titles.append(ax.get_title(loc="left"))
    assert (tmp_path / "lists.png").read_bytes() == (tmp_path / "arrays.png").read_bytes()
    median = sorted(max(int(d), 1) / 1e3 for d in durations)[150]
    assert titles[0] == titles[1] == f"f: 301, every 6th drawn (dashed: median {median:.1f} µs)"


def test_all_objects_strips_keep_only_the_objects_drawn(tmp_path, monkeypatch):
    """Beyond MAX_STRIPS objects whose field changed, the all-objects page keeps the
    series of every n-th of them only (the others' values were most of a 10M-event
    report's helper), says of how many, and draws what it kept."""
    import numpy as np

    from ctracer import analysis
    from ctracer.report import html
    from ctracer.report.pages import objects
    from support.synthetic_trace import write_synthetic_trace

    path = tmp_path / "t.ctrace"
    write_synthetic_trace(str(path), threads=3, lifecycles=6, sends=3, seed=5)
    data = analysis.load(str(path))
    site = html.ReportSite(data, str(tmp_path / "r"), True)
    whole, values = objects.strips(site)
    monkeypatch.setattr(plots, "MAX_STRIPS", 4)
    sampled, values_sampled = objects.strips(site)
    assert values == values_sampled and list(whole) == list(sampled)
    for strips in (*whole.values(), *sampled.values()):  # made when drawn, not before
        assert not len(strips)
        strips.fill(strips)
    lengths = data.series_lengths()
    names = [f.name for f in data.layout.fields]
    for name, strips in sampled.items():
        changed = np.flatnonzero(lengths[:, names.index(name)] > 1)
        assert whole[name].of == strips.of == len(changed) == len(whole[name])
        step = -(-len(changed) // 4)
        assert [s.label for s in strips] == [data.objects.labels[o] for o in changed[::step]]
        assert [s.values for s in strips] == [s.values for s in whole[name]][::step]
    busiest = max(sampled, key=lambda name: sampled[name].of)
    assert sampled[busiest].of > 8
    labels = []
    real = plots._Painter._labels
    monkeypatch.setattr(plots._Painter, "_labels",
                        staticmethod(lambda ax, *texts: labels.append(texts) or real(ax, *texts)))
    plots._init_worker(data.layout.to_json())
    plots._painter.strip_plot(plots.StripPlot(str(tmp_path / "s.png"), busiest, busiest,
                                              sampled[busiest]))
    step = -(-sampled[busiest].of // 4)
    every = plots.ordinal(step)
    assert labels[-1][2] == (f"objects (of {sampled[busiest].of}, every {every} drawn), "
                             "by first appearance")
    assert (tmp_path / "s.png").stat().st_size > 0


def test_ordinal_numbers():
    assert [plots.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111, 112)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st",
        "111th", "112th"]
