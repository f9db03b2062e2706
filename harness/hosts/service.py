"""A host's serving engine as hosts.yaml declares it (`service:`), held on the Host: checked
against a run's cells before anything runs, and recorded beside each service result.

harness.protocol.deployment has the rules (which values a cell runs with, when a cell and its
host disagree) and the worker applies them again, for the paths that reach a host without a run
(the A/B gate, bisect); this module applies them where the controller holds both the cells and
the hosts chosen for them, so a conflict is one `hosts.yaml:line:col:` line, exit 2, before any
engine is touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.protocol import deployment, params
from harness.protocol.errors import InputError
from harness.protocol.workloads import SPECS


@dataclass(frozen=True)
class HostService:
    host: str
    declared: dict                       # cell parameter -> value (no secrets: see deployment)
    path: str | None                     # the hosts file, as it was named
    block: tuple = (None, None)          # (line, column) of the `service:` key
    marks: dict = field(default_factory=dict)   # cell parameter -> (line, column) of its value

    def error(self, param: str, message: str) -> InputError:
        line, column = self.marks.get(param, self.block)
        return InputError(self.path, line, column, message)

    def record(self) -> dict:
        """What a result keeps of the deployment it measured: which host's block, where it is
        declared, and every value it declares (a key only as its `${VAR}` name)."""
        where = f"{self.path or 'hosts.yaml'}:{self.block[0]}" if self.block[0] else self.path
        return {"host": self.host, "declared_in": where, **self.declared}


def check_cells(cells: list[dict], hosts: list, where: str | None, given=None) -> None:
    """Refuse (InputError) a service cell that cannot run on one of `hosts`, any of which may
    get it: it conflicts with the host's `service:`, or neither declares an engine. `where`
    names the scenario for errors that are the scenario's; `given(cell)`, the parameters the
    scenario sets on a cell (Scenario.given; None: those away from their default)."""
    own_checks = SPECS["service"].checks
    for cell in (c for c in cells if c.get("workload") == "service"):
        mine = given(cell) if given is not None else None
        for host in hosts:
            service = getattr(host, "service", None)
            label = params.cell_label(cell)
            if service is None:
                if cell["service_manager"] == "setsid" and not cell["service_start"]:
                    raise InputError(where, None, None,
                                     f"cell '{label}' declares no engine (service_start) and "
                                     f"host '{host.name}' has no service: in hosts.yaml; give "
                                     f"one of them")
                continue
            problem = deployment.conflict(cell, service.declared, mine)
            if problem is not None:
                param, why = problem
                raise service.error(param, f"host '{host.name}', cell '{label}': {why}; drop "
                                           f"{param} from the scenario or run it on a host "
                                           f"without service:")
            merged = deployment.effective(cell, service.declared, mine)
            for check in own_checks:
                found = check(merged)
                if found is not None:
                    blamed, message = found
                    raise service.error(blamed[-1] if blamed[-1] in service.declared else
                                        "service_manager",
                                        f"host '{host.name}', cell '{label}': {message}")


def record(host, result: dict) -> None:
    """A service result run on a host with a `service:` says which deployment it measured."""
    service = getattr(host, "service", None)
    if service is not None and (result.get("cell") or {}).get("workload") == "service":
        result["deployment"] = service.record()
