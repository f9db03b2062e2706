"""`harness ui`: the MLflow UI on the local store, or where a tracking server's own UI is."""

from __future__ import annotations

import os
import sys
from typing import Optional

import typer
from rich.markup import escape

from harness.commands.options import console, tracking_uri_option


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
    console.print(f"MLflow UI on http://{host}:{port} (store {shown}); Ctrl-C to stop")
    os.execv(sys.executable, [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                              "--host", host, "--port", str(port)])
