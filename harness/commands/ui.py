"""`harness ui`: the MLflow UI on the local store, or where a tracking server's own UI is."""

from __future__ import annotations

import os
import sys
from typing import Optional

import typer
from rich.markup import escape

from harness.commands.options import console, err, tracking_uri_option


def ui(port: int = typer.Option(5000, help="port of the MLflow UI"),
       host: str = typer.Option("127.0.0.1", help="address to listen on"),
       tracking_uri: Optional[str] = tracking_uri_option()):
    """Open the MLflow UI on the local store (results/mlflow.db)."""
    from harness.sweep import tracking
    from harness.protocol.redact import redact_uri
    uri = tracking.resolve_tracking_uri(tracking_uri)
    shown = escape(redact_uri(uri))            # the real one goes to mlflow, never the screen
    if uri.startswith(("http://", "https://")):
        console.print(f"The tracking server has its own UI: {shown}")
        return
    taken = _port_taken(host, port)
    if taken:
        err.print(f"[red]error:[/] cannot serve the UI on {escape(host)}:{port}: {escape(taken)} "
                  f"(another `harness ui` or MLflow?); pick another with --port", highlight=False)
        raise typer.Exit(2)
    from harness.sweep.tracking import UI_WORKFLOW
    console.print(f"MLflow UI on http://{host}:{port}/#/experiments?{UI_WORKFLOW} (store "
                  f"{shown}); Ctrl-C to stop")
    os.execv(sys.executable, [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                              "--host", host, "--port", str(port)])


def _port_taken(host: str, port: int) -> str | None:
    """Why (host, port) cannot be listened on, or None. Bound with SO_REUSEADDR as the server
    binds: a port left in TIME_WAIT is free to it, one with a listener is not. Without this
    check MLflow's server logged the bind error and `harness ui` exited 0."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        return f"cannot resolve {host}: {e.strerror}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            return e.strerror or str(e)
    return None
