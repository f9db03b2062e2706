"""A sweep on the controller: the scenario (validated, expanded into cells), the runner that
puts cells onto host slots, the journal every result is written to first, the MLflow upload,
and the end-of-run summary and derived metrics. Never imports torch."""
