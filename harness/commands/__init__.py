"""The `harness` CLI, one module per verb (as asv's commands/); harness/cli.py assembles them.
Each command parses its options, calls the sweep, hosts or gate code, and prints;
options.py holds what the verbs share (consoles, the input-error line, repeated options)."""
