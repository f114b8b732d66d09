"""The hand-written ``_core.pyi`` matches the compiled module (``mypy.stubtest``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed")
def test_core_stub_matches_the_extension() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "meshplan._core"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_package_ships_its_typing_files() -> None:
    from pathlib import Path

    import meshplan

    root = Path(meshplan.__file__).parent
    assert (root / "py.typed").is_file()
    assert (root / "_core.pyi").is_file()
