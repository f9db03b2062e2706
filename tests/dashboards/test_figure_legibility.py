"""What a reader can tell apart in the figures, checked on the drawn matplotlib figures
(captured as each is saved): lines of one verify mode in distinct shades, names that say greedy
or synthetic, legends off the data, one noisy repeat never squashing the lines, no empty GPU
panel on a CPU run, and the compared-with run drawn, faded, in every figure."""

from __future__ import annotations

import colorsys
import warnings

import pytest
from matplotlib.colors import to_rgb

from dashboard_fixtures import (
    cpu_result, gpu_result, gpu_sweep, kernel_sweep,
)
from harness.dashboards import figures, idle, kernels, style


@pytest.fixture
def drawn(monkeypatch):
    """Every Figure a dashboards function saves, in order (and the PNG still written)."""
    figs = []
    save = style.save

    def keep(fig, out_path):
        figs.append(fig)
        return save(fig, out_path)

    monkeypatch.setattr(style, "save", keep)
    # Colours picked for new phases and modes stay inside the test.
    monkeypatch.setattr(style, "PHASE_COLORS", dict(style.PHASE_COLORS))
    monkeypatch.setattr(style, "MODE_COLORS", dict(style.MODE_COLORS))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield figs


def quickstart(tps_greedy=(170.0, 145.0), tps_synthetic=(300.0, 200.0)) -> list[dict]:
    """The CPU quickstart's four cells: sdpa only, greedy and synthetic at two contexts."""
    return [cpu_result(ctx, acc, tps) for acc, rates in (("greedy", tps_greedy),
                                                          ("synthetic", tps_synthetic))
            for ctx, tps in zip((256, 1024), rates)]


def bbox(artist):
    """Where the artist was drawn (display units; the layout is the one the PNG got)."""
    return artist.get_window_extent()


def hue(color) -> float:
    return colorsys.rgb_to_hls(*to_rgb(color))[0]


def test_lines_of_one_verify_mode_get_distinct_shades_and_say_greedy_or_synthetic(drawn, tmp_path):
    figures.tokens_vs_context(quickstart(), tmp_path / "tvc.png")
    ax = drawn[-1].axes[0]
    handles, labels = ax.get_legend_handles_labels()
    assert labels == ["greedy", "synthetic τ=4"]
    colors = [to_rgb(h.lines[0].get_color()) for h in handles]
    assert len(set(colors)) == 2                       # not one colour for both
    sdpa = style.MODE_COLORS["sdpa"]
    assert all(abs(hue(c) - hue(sdpa)) < 0.02 for c in colors)   # both still "sdpa green"
    # The legend says what every line shares, and sits under the axes, never on a line.
    assert "every line verify=sdpa" in ax.get_legend().get_title().get_text()
    assert bbox(ax.get_legend()).y1 <= bbox(ax).y0


def test_one_noisy_repeat_is_cut_at_the_top_not_squashing_the_lines(drawn, tmp_path):
    results = quickstart()
    results[2]["samples"]["tokens_per_s"] = [290.0, 300.0, 2000.0]   # one repeat 7x the rest
    figures.tokens_vs_context(results, tmp_path / "tvc.png")
    ax = drawn[-1].axes[0]
    bottom, top = ax.get_ylim()
    assert 300 * 1.1 <= top < 600                      # the medians fill the plot
    assert any(t.get_text() == "2000" for t in ax.texts)   # the cut bar says where it ends
    # Without the outlier nothing is cut.
    figures.tokens_vs_context(quickstart(), tmp_path / "calm.png")
    assert not [t for t in drawn[-1].axes[0].texts if t.get_text().isdigit()]


def test_a_cpu_run_has_no_empty_gpu_idle_panel_but_one_line(drawn, tmp_path):
    idle.idle_by_phase(quickstart(), tmp_path / "idle.png")
    fig = drawn[-1]
    assert len(fig.axes) == 1 and fig.axes[0].get_xlabel() == "host time per step (ms)"
    assert "GPU idle: n/a (no GPU on this host)" in fig.get_suptitle()
    assert fig.axes[0].get_yticklabels()[0].get_text() == "ctx=1024 synthetic τ=4"

    # A GPU run keeps both panels; the shared legend sits below both, over no bar.
    idle.idle_by_phase(gpu_sweep(), tmp_path / "gpu.png")
    fig = drawn[-1]
    assert [ax.get_xlabel() for ax in fig.axes] == ["GPU idle fraction of a step (%)",
                                                     "host time per step (ms)"]
    (legend,) = fig.legends
    assert all(bbox(legend).y1 <= bbox(ax).y0 for ax in fig.axes)
    assert not [ax.get_legend() for ax in fig.axes if ax.get_legend()]


def test_panels_with_nothing_say_so_in_one_line_for_the_report(tmp_path):
    one_mode = quickstart()
    with pytest.raises(style.NothingToDraw, match="only verify=sdpa was measured"):
        figures.speedup_heatmap(one_mode, tmp_path / "h.png", card=False)
    assert not (tmp_path / "h.png").exists()
    with pytest.raises(style.NothingToDraw, match="no kernel cells"):
        kernels.roofline_vs_context(one_mode, tmp_path / "k.png", card=False)
    with pytest.raises(style.NothingToDraw, match="n/a \\(no GPU\\)"):
        idle.timeline(one_mode[0], tmp_path / "t.png", card=False)
    # Called on its own (MLflow, scripts), a figure still says it as a card.
    assert figures.speedup_heatmap(one_mode, tmp_path / "card.png").is_file()


def faded(artists) -> list:
    return [a for a in artists if a.get_alpha() == style.BASE_ALPHA]


def test_the_base_run_is_drawn_faded_in_every_figure(drawn, tmp_path):
    head, base = gpu_sweep(), gpu_sweep(speed=1.2)
    for r in base:  # the base's own timelines: a longer span, so its lane is its own
        for iv in r.get("timeline") or []:
            iv["end_ms"] *= 1.2
    name = "base run 20260430-020000-bbbbbb"

    figures.tokens_vs_context(head, tmp_path / "tvc.png", base=base, base_name=name)
    ax = drawn[-1].axes[0]
    # One faded line under each head line (failed cells aside), and the legend says which.
    assert len(faded(ax.get_lines())) == len({(r["cell"]["verify_mode"], r["cell"]["graph_capture"])
                                              for r in base if r["status"] == "ok"})
    assert f"faded: {name}" in [t.get_text() for t in ax.get_legend().get_texts()]

    figures.speedup_heatmap(head, tmp_path / "heat.png", base=base, base_name=name)
    base_texts = [t.get_text() for t in drawn[-1].axes[0].texts if t.get_text().startswith("base ")]
    assert base_texts and "base 3.60×" in base_texts     # 900 / 250, as the head's

    idle.idle_by_phase(head, tmp_path / "idle.png", base=base, base_name=name)
    for ax in drawn[-1].axes:
        assert faded(ax.patches), ax.get_xlabel()

    kernels.roofline_vs_context(kernel_sweep(), tmp_path / "roof.png", base=kernel_sweep(),
                                base_name=name)
    assert faded(drawn[-1].axes[0].get_lines())

    cell = next(r for r in head if r.get("timeline"))
    same = next(r for r in base if r["cell_id"] == cell["cell_id"])
    idle.timeline(cell, tmp_path / "tl.png", base=same, base_name=name)
    ax = drawn[-1].axes[0]
    assert f"GPU busy, {name}" in [t.get_text() for t in ax.get_yticklabels()]
    assert faded(ax.collections) and "(base: " in ax.get_title()


def test_names_say_what_differs_and_nothing_else():
    greedy, synthetic = cpu_result(256, "greedy", 1.0), cpu_result(256, "synthetic", 1.0)
    assert style.names_of([greedy["cell"], synthetic["cell"]]) == ["greedy", "synthetic τ=4"]
    assert style.full_label(greedy).endswith(" greedy")
    assert style.full_label(synthetic).endswith(" synthetic tau=4")
    # the report's word is the label's own, τ drawn for tau
    assert synthetic["label"].endswith(" synthetic tau=4") and greedy["label"].endswith(" greedy")
    old_label = {**synthetic, "label": synthetic["label"].replace(" synthetic tau=", " tau=")}
    assert style.full_label(old_label) == synthetic["label"]      # journaled before labels said it
    # A kernel knob left at auto and a parameter the other workload has are not spelt out;
    # a workload other than decode is one word.
    auto = gpu_result(4096, "triton")
    pinned = gpu_result(4096, "triton")
    pinned["cell"] = {**pinned["cell"], "fused_ops": False}
    peer = {**auto["cell"], "workload": "peer", "peer_cache": "static"}
    names = style.names_of([auto["cell"], pinned["cell"], peer])
    assert names == ["", "fused_ops=false", "peer peer_cache=static"]


def test_phases_nobody_named_get_colours_of_their_own(monkeypatch):
    monkeypatch.setattr(style, "PHASE_COLORS", dict(style.PHASE_COLORS))
    new = [style.phase_color(p) for p in ("graph", "record")]
    assert len(set(new)) == 2 and style.GAP_COLOR not in new
    assert set(new).isdisjoint(style.MODE_COLORS.values())
    assert style.phase_color("graph") == new[0]                  # stable once picked
    assert style.phase_color("other") == style.OTHER_COLOR


def test_lines_alike_in_mode_graph_and_tree_are_shaded_apart():
    """A GPU sweep's lines differ in mode, graph and tree already: those keep the plain mode
    colour; only lines that would look identical are shaded."""
    plain = [gpu_result(ctx, mode, graph, tree) for ctx in (4096, 65536)
             for mode in ("custom", "triton") for graph, tree in (("full", "gpu"), ("none", "cpu"))]
    lines = figures._lines(figures._measured(plain), [])
    assert {ln.color for ln in lines.values()} == {to_rgb(style.MODE_COLORS[m])
                                                   for m in ("custom", "triton")}
    twin = gpu_result(4096, "custom")
    twin["cell"] = {**twin["cell"], "fused_ops": False}
    lines = figures._lines(figures._measured(plain + [twin]), [])
    custom_full = [ln for ln in lines.values() if ln.cell["verify_mode"] == "custom"
                   and ln.cell["graph_capture"] == "full"]
    assert len({ln.color for ln in custom_full}) == 2

