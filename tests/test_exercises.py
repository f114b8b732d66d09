"""docs/exercises.md is what scripts/gen_exercises.py prints from the current cost model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gen_exercises.py"
PAGE = ROOT / "docs" / "exercises.md"


@pytest.mark.skipif(not SCRIPT.is_file(), reason="tests run outside the source tree")
def test_exercises_page_is_current() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr
    assert PAGE.is_file(), "docs/exercises.md is missing: run python scripts/gen_exercises.py --write"
    assert done.stdout == PAGE.read_text(encoding="utf-8"), (
        "docs/exercises.md is stale: run python scripts/gen_exercises.py --write"
    )


@pytest.mark.skipif(not PAGE.is_file(), reason="tests run outside the source tree")
def test_exercises_page_answers_the_worked_checks() -> None:
    text = PAGE.read_text(encoding="utf-8")
    # docs/costmodel.md §7(a) and §7(b): exact bytes, and the latency-bound verdict.
    assert "**3,932,160 B**" in text and "**0.044 %**" in text
    assert "| latency-bound | **yes** |" in text
    assert "**65,536 B** per token per MoE layer" in text and "**57,344 B** forward" in text
    assert "**Verdict:**" in text
