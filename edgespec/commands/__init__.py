"""Every Click command, one module each; library modules never import from here.

`main` is the console entry point (pyproject's `edgespec`), `cli` the root group.
"""

from . import bench, chat, doctor, models, profile, prompt, rpc_server, serve  # noqa: F401 - registers the commands
from .root import cli, main

__all__ = ["cli", "main"]
