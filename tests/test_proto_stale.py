"""The committed gRPC code is what ``scripts/gen_proto.py`` makes of ``proto/`` today: edit the
.proto without regenerating (or regenerate with other tool versions) and this fails."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gen_proto.py"


def gen_proto() -> ModuleType:
    if not SCRIPT.is_file():
        pytest.skip("tests run outside the source tree")
    spec = importlib.util.spec_from_file_location("gen_proto", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_grpc_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    gen = gen_proto()
    written = gen.generate(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in written] == list(gen.GENERATED)
    stale = []
    for name in gen.GENERATED:
        fresh = (tmp_path / name).read_bytes()
        committed = ROOT / "python" / name
        if not committed.is_file() or committed.read_bytes() != fresh:
            stale.append(name)
    assert not stale, (
        f"stale generated code: {stale}; run `python scripts/gen_proto.py` and commit the result"
    )


def test_the_check_notices_a_change(tmp_path: Path) -> None:
    # A proto edit must change the generated files, or the test above could never fail.
    gen = gen_proto()
    proto = tmp_path / "proto"
    (proto / "meshplan" / "v1").mkdir(parents=True)
    original = (ROOT / "proto" / "meshplan" / "v1" / "planner.proto").read_text()
    (proto / "meshplan" / "v1" / "planner.proto").write_text(
        original + "\nmessage StaleCheck { int64 x = 1; }\n"
    )
    gen.PROTO_ROOT = proto
    out = tmp_path / "out"
    gen.generate(out)
    first = gen.GENERATED[0]
    assert (out / first).read_bytes() != (ROOT / "python" / first).read_bytes()
