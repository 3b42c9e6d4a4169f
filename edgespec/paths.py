"""Where edgespec keeps its files: one directory, movable with EDGESPEC_HOME."""

from __future__ import annotations

import os
from pathlib import Path

import click


def home() -> Path:
    env = os.environ.get("EDGESPEC_HOME")
    path = Path(env).expanduser() if env else Path(click.get_app_dir("edgespec"))
    return path


def models_dir() -> Path:
    return home() / "models"


def profiles_dir() -> Path:
    return home() / "profiles"
