"""The wire between the controller and a worker process, beyond the cell and result JSON.

A worker writes one result JSON line per cell on stdout; on stderr, progress lines
(`@@progress {json}`) and, in serve mode, a line `@@cell {"seq": N}` before each cell's output,
so the controller knows which cell the lines that follow belong to. SERVE_PROTOCOL is the
version of serve mode: the controller reads it from a source tree (this file, or the flat
harness/worker.py of older commits) to know whether that tree's worker can serve.
"""

PROGRESS_PREFIX = "@@progress "
CELL_PREFIX = "@@cell "
SERVE_PROTOCOL = 1

# Set by the controller on every worker it starts: GPU processes whose parent chain leads to
# this pid are the harness's own (sibling slots), not foreign processes to report.
CONTROLLER_PID_ENV = "HARNESS_CONTROLLER_PID"
