"""Typing: the hand-written ``_core.pyi`` matches the compiled module (``mypy.stubtest``), the
package ships its typing files, and its source passes ``mypy --strict``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import meshplan

needs_mypy = pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None, reason="mypy is not installed"
)


@needs_mypy
def test_core_stub_matches_the_extension() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "meshplan._core"],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_package_ships_its_typing_files() -> None:
    root = Path(meshplan.__file__).parent
    assert (root / "py.typed").is_file()
    assert (root / "_core.pyi").is_file()


@needs_mypy
def test_package_source_passes_strict_mypy(tmp_path: Path) -> None:
    source = Path(__file__).resolve().parent.parent / "python" / "meshplan"
    if not source.is_dir():
        pytest.skip("tests run outside the source tree")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
