"""What Slurm's words mean to the harness: job states, pending reasons and sbatch's refusals,
each mapped onto the runner's three outcomes (harness/hosts/interface.py).

- a **cell failure**: the cell's own doing (it ran past its time limit, out of memory); its
  failed result is journaled and never retried, as on every host;
- a **lost attempt** (`AttemptLost`): the cluster failed under the cell (its node died, a
  higher-priority job preempted it); the runner runs the cell again, on this host or another,
  without holding it against the host;
- a **host failure**: Slurm refuses the job as configured (`HostBroken`: a partition that does
  not exist, a time limit over the partition's) or does not answer (`HostUnavailable`, retried
  with backoff).

docs/slurm.md has the same table for people; tests/hosts/test_slurm_units.py checks that every
state Slurm documents is in it.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a task in a state is doing, for the controller.
WAITING = "waiting"          # not running yet (or paused): the cell's timeout does not run
RUNNING = "running"          # its timeout runs; its result may land any moment
ENDED = "ended"              # finished by itself: its result must be in the shared folder
CELL_FAILED = "cell-failed"  # ended for a reason of the cell's: a failed result, not retried
LOST = "lost"                # ended for a reason of the cluster's: the cell runs again


@dataclass(frozen=True)
class StateRule:
    kind: str
    why: str = ""            # for failures: what the cell's error says happened


# Every job state of squeue(1) "JOB STATE CODES" (Slurm 22.05 .. 24.x).
STATES: dict[str, StateRule] = {
    "PENDING": StateRule(WAITING),
    "CONFIGURING": StateRule(WAITING),        # its nodes are booting
    "REQUEUED": StateRule(WAITING),
    "REQUEUE_FED": StateRule(WAITING),
    "REQUEUE_HOLD": StateRule(WAITING),       # held after a requeue: `scontrol release` starts it
    "RESV_DEL_HOLD": StateRule(WAITING),
    "SUSPENDED": StateRule(WAITING),          # paused by the scheduler or an administrator
    "STOPPED": StateRule(WAITING),            # SIGSTOPped: paused, resources kept
    "RUNNING": StateRule(RUNNING),
    "COMPLETING": StateRule(RUNNING),         # its processes are exiting: the result may be in
    "SIGNALING": StateRule(RUNNING),
    "STAGE_OUT": StateRule(RUNNING),
    "RESIZING": StateRule(RUNNING),
    "COMPLETED": StateRule(ENDED),
    "FAILED": StateRule(ENDED),               # the worker exits 1 for a failed cell, result written
    "TIMEOUT": StateRule(CELL_FAILED, "Slurm stopped the task at its time limit (TIMEOUT)"),
    "OUT_OF_MEMORY": StateRule(CELL_FAILED, "the task ran out of memory (OUT_OF_MEMORY); ask "
                                            "for more with --mem in the host's sbatch: lines"),
    "CANCELLED": StateRule(CELL_FAILED, "the task was cancelled outside the harness "
                                        "(CANCELLED: scancel, or an administrator)"),
    "DEADLINE": StateRule(CELL_FAILED, "the job's deadline passed before it could finish "
                                       "(DEADLINE)"),
    "SPECIAL_EXIT": StateRule(CELL_FAILED, "the task ended in SPECIAL_EXIT (requeued and held)"),
    "NODE_FAIL": StateRule(LOST, "its node failed (NODE_FAIL)"),
    "BOOT_FAIL": StateRule(LOST, "its node failed to boot (BOOT_FAIL)"),
    "PREEMPTED": StateRule(LOST, "it was preempted by a higher-priority job (PREEMPTED)"),
    "REVOKED": StateRule(LOST, "its federated sibling ran elsewhere (REVOKED)"),
}

# An unknown state (a newer Slurm's) is waited on, as the safe reading of a state that names
# no end; the task's timeout still runs once it has been seen running.
UNKNOWN = StateRule(WAITING)


def rule(state: str) -> StateRule:
    """The rule for a state as squeue prints it (`CANCELLED by 1000` reads as CANCELLED)."""
    return STATES.get(state.split()[0] if state else "", UNKNOWN)


# Pending reasons under which Slurm will never start the job as submitted: waiting would wait
# for ever, so the host is given up with the reason (a person fixes hosts.yaml or the account).
NEVER_STARTS: dict[str, str] = {
    "PartitionTimeLimit": "the time limit is over the partition's (set time_limit lower)",
    "PartitionNodeLimit": "the job asks for more nodes than the partition allows",
    "BadConstraints": "its constraints (--constraint, --gres, ...) match no node",
    "InvalidAccount": "the account is not valid for this user",
    "InvalidQOS": "the QOS is not valid for this user or account",
    "QOSMaxWallDurationPerJobLimit": "the time limit is over the QOS's (set time_limit lower)",
    "AssocMaxWallDurationPerJobLimit": "the time limit is over the account's (set time_limit "
                                       "lower)",
    "DependencyNeverSatisfied": "a dependency can never be satisfied",
}


def never_starts(reason: str) -> str | None:
    """Why a job pending for `reason` will never start, or None if it may."""
    return NEVER_STARTS.get(reason.split(",")[0].strip() if reason else "")


# sbatch's refusals that go away by themselves (a controller restarting, a submit limit that
# frees up as our own jobs end): retried with backoff. Every other refusal is the job as
# configured (a partition, account, gres or time limit Slurm rejects): the host is given up.
TRANSIENT_REFUSALS = (
    "unable to contact slurm controller",
    "socket timed out",
    "temporarily unable",
    "resource temporarily unavailable",
    "communication connection failure",
    "zero bytes were transmitted",
    "job submit limit",
    "maxsubmit",
)


def is_transient(message: str) -> bool:
    lowered = message.lower()
    return any(part in lowered for part in TRANSIENT_REFUSALS)
