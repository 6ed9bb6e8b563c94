"""Generate the Python protobuf/gRPC stubs under shared/proto from protos/.

Run with `make protos` (or `python protos/generate.py`). `--check DIR` writes to DIR instead, which
tests use to prove that the committed stubs are current.

Why the import rewrite: protoc emits `from apprentice.v1 import common_pb2`, which only works if the
output folder is on sys.path. We keep the stubs inside the `shared` package instead, so imports are
rewritten to `from shared.proto.apprentice.v1 import ...`.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
DEFAULT_OUT = ROOT / "shared" / "proto"
PACKAGE_PREFIX = "shared.proto."


def generate(out: Path) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc  # dev dependency: only needed when protos change

    files = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    out.mkdir(parents=True, exist_ok=True)
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", *files]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    written = []
    for path in sorted(out.rglob("*.py*")):
        if path.suffix not in (".py", ".pyi"):
            continue
        text = path.read_text()
        new = re.sub(r"^from apprentice\.", f"from {PACKAGE_PREFIX}apprentice.", text, flags=re.M)
        path.write_text(new)
        written.append(path)
    for pkg in (out, out / "apprentice", out / "apprentice" / "v1"):
        init = pkg / "__init__.py"
        if not init.exists():
            init.write_text("")
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ns = ap.parse_args(argv)
    written = generate(ns.out)
    print(f"wrote {len(written)} files under {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
