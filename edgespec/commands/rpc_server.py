"""`edgespec rpc-server`: lend this machine's GPU or CPU over llama.cpp's RPC protocol."""

from __future__ import annotations

import os
import sys

import click

from ..errors import ConfigError
from .root import CONTEXT, cli
from .. import paths
from ..backend import rpc
from ..render import stderr_console


# ---- rpc-server --------------------------------------------------------------------------------
@cli.command("rpc-server", context_settings=CONTEXT)
@click.option("--host", default="127.0.0.1", show_default=True, envvar="EDGESPEC_RPC_HOST",
              help="Address to listen on; 0.0.0.0 for other machines (trusted networks only).")
@click.option("-p", "--port", type=click.IntRange(1, 65535), default=50052, show_default=True, envvar="EDGESPEC_RPC_PORT")
@click.option("-t", "--threads", type=click.IntRange(1, 1024), help="CPU threads (default: physical cores).")
@click.option("--cache", is_flag=True, help="Keep received tensors on disk under the user dir: reloads skip the network.")
@click.option("--cpu", "use_cpu", is_flag=True, help="Serve the CPU even when this machine has GPUs.")
def rpc_server(host, port, threads, cache, use_cpu):
    """Lend this machine's GPU (or CPU) to another machine's edgespec (`--rpc HOST:PORT` there).

    Runs until Ctrl-C. The protocol has no authentication or encryption: do not expose it.
    """

    err = stderr_console()
    if ":" in host:
        raise ConfigError(f"--host {host}: llama.cpp's RPC takes IPv4 addresses or host names, not IPv6")
    if host not in ("127.0.0.1", "localhost"):
        err.print(f"[yellow]warning:[/] serving on {host}: anyone who can reach port {port} can use this machine's memory and compute")
    cache_dir = None
    if cache:
        cache_dir = paths.home() / "rpc-cache"
        cache_dir.mkdir(parents=True, exist_ok=True)
    err.print(f"edgespec rpc-server on {host}:{port}; on the other machine: [bold]edgespec prompt --rpc {host}:{port} ...[/]  (Ctrl-C stops)")
    try:
        rpc.serve(host, port, threads, str(cache_dir) if cache_dir else None, use_cpu)
    except KeyboardInterrupt:
        err.print("rpc-server stopped")
        # The serving thread is inside a C call that never returns: leave without finalizing.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
