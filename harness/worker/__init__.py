"""The worker: `python -m harness.worker` runs cells on this host (main), with the device, the
timing and measurement code (measure, idle meter, sync audit, ceilings, host facts) and the
workloads. It imports the standard library, torch, numpy, the bundled kernels and
harness.protocol, never controller code."""
