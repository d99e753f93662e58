"""Regenerates the Python stubs of the `sieve.v1` protos into `sieve/v1/`.

Run `python protos/generate.py` after editing a .proto file; `python protos/generate.py --check`
exits 1 when the committed stubs differ from what the protos produce (CI runs it).
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

import grpc_tools
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT_PACKAGE = ROOT / "sieve" / "v1"


def generate(out_root: Path) -> list[Path]:
    """Runs protoc for every proto under protos/sieve/v1 into out_root; returns the files written."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "sieve" / "v1").glob("*.proto"))
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"-I{well_known}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    generated = sorted((out_root / "sieve" / "v1").glob("*_pb2*.py*"))
    return generated


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail when committed stubs are stale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale: list[str] = []
        for path in fresh:
            target = OUT_PACKAGE / path.name
            if args.check:
                if not target.exists() or not filecmp.cmp(path, target, shallow=False):
                    stale.append(path.name)
            else:
                target.write_bytes(path.read_bytes())
        if args.check:
            known = {p.name for p in fresh}
            extra = [p.name for p in OUT_PACKAGE.glob("*_pb2*.py*") if p.name not in known]
            if stale or extra:
                print(f"stale generated stubs: {stale + extra}; run python protos/generate.py", file=sys.stderr)
                return 1
            print(f"generated stubs are fresh ({len(fresh)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
