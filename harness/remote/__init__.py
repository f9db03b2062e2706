"""What runs on a remote host outside the worker, standard library only: the launcher an SSH
host runs per cell (lock the GPU, check it, start the worker) and the probe of what a host has.
`python -S -m harness.remote` is the launcher."""
