"""The layers of the package, checked on every import statement (function-level ones too).

Three processes share this code (docs/ARCHITECTURE.md): the controller (commands, sweep, hosts,
gate, the CLI, dashboards) never imports torch or the worker's code; the worker side (worker,
decode, kernels) and the remote launcher import nothing of the controller; protocol is the
standard library alone, and remote too (it runs under `python -S` on a host that may have
nothing else). A statement that breaks a rule fails here with its file and line.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CONTROLLER = ("harness.cli", "harness.commands", "harness.sweep", "harness.hosts", "harness.gate",
              "harness.dashboards")
WORKER_SIDE = ("harness.worker", "harness.decode", "harness.kernels")
REMOTE = ("harness.remote",)
PROTOCOL = ("harness.protocol",)
STDLIB = set(sys.stdlib_module_names)


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name (kernels/ and dashboards/ as installed)."""
    found = {}
    for top, package in (("harness", "harness"), ("kernels", "harness.kernels"),
                         ("dashboards", "harness.dashboards")):
        for path in sorted((REPO / top).rglob("*.py")):
            parts = list(path.relative_to(REPO / top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def statements(name: str, path: Path) -> list[tuple[list[str], list[str], int]]:
    """(modules the statement surely imports, names it may import as modules, line) for every
    import statement in the module `name` at `path`, relative imports resolved to absolute."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.append(([alias.name for alias in node.names], [], node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from harness.x import y` may import the module harness.x.y.
            out.append(([base], [f"{base}.{alias.name}" for alias in node.names], node.lineno))
    return out


def imports(name: str, path: Path) -> list[tuple[str, int]]:
    """(module imported, line) for every import statement in the file, counting both the
    module of a `from` import and each name it may import as a module."""
    return [(m, line) for sure, maybe, line in statements(name, path) for m in sure + maybe]


def within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def violations(rule, found: dict[str, Path] | None = None) -> list[str]:
    found = modules() if found is None else found
    bad = []
    for name, path in found.items():
        for imported, line in imports(name, path):
            why = rule(name, imported, imported in found or within(imported, ("harness",)))
            if why:
                bad.append(f"{path}:{line}: {name} imports {imported} ({why})")
    return sorted(set(bad))


def test_every_module_belongs_to_a_layer():
    layered = CONTROLLER + WORKER_SIDE + REMOTE + PROTOCOL
    loose = [n for n in modules() if n != "harness" and not within(n, layered)]
    assert loose == [], "modules outside every layer: " + ", ".join(loose)


def controller_rule(name, imported, ours):
    if not within(name, CONTROLLER):
        return None
    if within(imported, ("torch", "triton")):
        return "the controller never imports torch"
    if ours and within(imported, WORKER_SIDE):
        return "the controller never imports worker code"
    return None


def test_the_controller_never_imports_torch_or_worker_code():
    assert violations(controller_rule) == []


def test_the_worker_side_and_remote_never_import_the_controller():
    def rule(name, imported, ours):
        if within(name, WORKER_SIDE + REMOTE) and ours and within(imported, CONTROLLER):
            return "worker and remote code never import the controller"
        return None
    assert violations(rule) == []


@pytest.mark.parametrize("layer", [PROTOCOL, REMOTE], ids=["protocol", "remote"])
def test_protocol_and_remote_are_the_standard_library_alone(layer):
    def rule(name, imported, ours):
        if not within(name, layer):
            return None
        top = imported.split(".")[0]
        if ours:
            return None if within(imported, PROTOCOL + layer + ("harness",)) and \
                imported not in ("harness.kernels", "harness.dashboards") else "outside its layer"
        return None if top in STDLIB or top == "__future__" else "not the standard library"
    assert violations(rule) == []


def test_every_import_of_the_package_names_a_module_that_exists():
    # A module moved without its importers (a relative `from .build import` left behind in a
    # subfolder, say) fails here, before a GPU host ever tries the import.
    found = modules()
    bad = [f"{path}:{line}: {m}" for name, path in found.items()
           for sure, _maybe, line in statements(name, path)
           for m in sure if within(m, ("harness",)) and m not in found]
    assert bad == []


def test_the_cli_starts_without_torch():
    # What the rules above promise, in a real interpreter: the whole CLI imports without torch.
    code = ("import sys, harness.cli, harness.commands.gate; "
            "bad = [m for m in ('torch', 'numpy', 'harness.worker.main', 'harness.decode.loop') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_rule_breaker_is_caught(tmp_path):
    # The check itself can fail: a controller module that imports torch and worker code inside
    # a function, as a lazy import would.
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import torch\n    from harness.worker import idle\n")
    found = {**modules(), "harness.sweep.bad": bad}
    assert violations(controller_rule, found) == [
        f"{bad}:2: harness.sweep.bad imports torch (the controller never imports torch)",
        f"{bad}:3: harness.sweep.bad imports harness.worker (the controller never imports worker code)",
        f"{bad}:3: harness.sweep.bad imports harness.worker.idle (the controller never imports "
        f"worker code)"]


def test_the_checkout_does_not_shadow_an_installed_kernels_library(tmp_path):
    """A process started in the checkout has it on sys.path, where a bare `import kernels`
    would find our kernels/ folder; Hugging Face transformers imports the `kernels` library
    whenever it is installed (5.25 on importing a model) and failed on ours. Once harness is
    imported, a bare name finds the installed library, and harness.kernels still our folder."""
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("WHO = 'the library'\n")
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}

    def run(code: str) -> str:
        return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True,
                              capture_output=True, text=True).stdout.strip()

    # Without harness the checkout comes first: the shadowing is real.
    assert run("import kernels; print(kernels.__file__)") == str(REPO / "kernels" / "__init__.py")
    got = run("import harness, kernels, harness.kernels.build as b; print(kernels.WHO); print(b.__file__)")
    assert got.splitlines() == ["the library", str(REPO / "kernels" / "build.py")]
