"""Figures and the HTML report of a run (matplotlib, Agg), shipped as harness.dashboards.

    style     one palette per verify mode (its shades for lines otherwise alike), phase
              colours, cell names that say greedy or synthetic, titles that say what and where
    figures   decode tokens/s vs context; speedup heatmap over a reference verify mode
    idle      GPU idle fraction by phase per cell; GPU timeline of a few steps (format there)
    kernels   kernel cells: % of roofline vs context
    history   a metric over nightly runs, baseline band, change points
    report    results/runs/<id>/report/index.html, self-contained (template: report.html.j2)
    headless  open a page in headless Chromium: console errors, images, text, screenshot

Every figure takes the journal's cell results (failed and unmeasured cells included), writes
one PNG and returns its path; `base=` (a compared-with run's results) draws that run faded
behind, and `card=False` (the report) raises style.NothingToDraw with the one line that says
why instead of drawing an empty card.
"""
