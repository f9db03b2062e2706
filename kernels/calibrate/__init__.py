"""Known GPU work for the calibration workload: a kernel that spins for a set time (spin)."""
