#!/usr/bin/env python3
"""Regenerates meshplan's gRPC code from ``proto/`` into ``python/``.

    python scripts/gen_proto.py            # rewrite python/meshplan/v1/planner_pb2*.py[i]
    python scripts/gen_proto.py --out DIR  # write them under DIR instead (the staleness test)

The proto package ``meshplan.v1`` lands as the Python package ``meshplan.v1``, so the generated
imports (``from meshplan.v1 import planner_pb2``) need no rewriting. ``grpcio-tools`` writes the
``_pb2.py`` and ``_pb2_grpc.py``; ``mypy-protobuf`` writes the typed ``.pyi`` of both. Both are
pinned in ``pyproject.toml`` (the ``test`` extra) because their output embeds their versions;
``tests/test_proto_stale.py`` fails when the committed files differ from a fresh run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PROTOS = ("meshplan/v1/planner.proto",)
OUT = ROOT / "python"
GENERATED = tuple(
    f"meshplan/v1/planner{suffix}"
    for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi")
)
"""The generated files, relative to the output directory."""


def _plugin(name: str) -> str:
    """The path of the protoc plugin ``name`` (installed by mypy-protobuf)."""
    for directory in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(directory) / name
        if candidate.is_file():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise SystemExit(f"gen_proto: {name} not found (pip install mypy-protobuf)")
    return found


def generate(out: Path) -> list[Path]:
    """Runs protoc with the gRPC and mypy plugins; returns the files written under ``out``."""
    try:
        import grpc_tools
        from grpc_tools import protoc
    except ImportError:
        raise SystemExit(
            "gen_proto: grpcio-tools is not installed (pip install '.[test]')"
        ) from None
    out.mkdir(parents=True, exist_ok=True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"--proto_path={PROTO_ROOT}",
        f"--proto_path={well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--plugin=protoc-gen-mypy={_plugin('protoc-gen-mypy')}",
        f"--mypy_out={out}",
        f"--plugin=protoc-gen-mypy_grpc={_plugin('protoc-gen-mypy_grpc')}",
        f"--mypy_grpc_out={out}",
        *PROTOS,
    ]
    code = protoc.main(args)
    if code != 0:
        raise SystemExit(f"gen_proto: protoc failed with exit code {code}")
    return [out / name for name in GENERATED]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output root (default: python/)")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path)


if __name__ == "__main__":
    main()
