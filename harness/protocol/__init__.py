"""What the controller and the worker agree on, in the standard library alone: a cell's
parameters and id (params), what each workload declares (workloads/), the model presets, the
errors shown without a traceback, URI redaction, and the wire format between the two processes
(wire)."""
