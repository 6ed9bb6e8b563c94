"""Generate the Python protobuf/gRPC stubs under shared/proto from protos/.

Run with `make protos` (or `python protos/generate.py`). `--out DIR` writes elsewhere, which tests use to
prove that the committed stubs are current.

The light Python client (`clients/python`, no torch) carries its own copy of the product-facing stubs;
the default run (no `--out`) regenerates it too, as this does on its own:

    python protos/generate.py --out clients/python/apprentice_client/_proto \
        --package apprentice_client._proto --only apprentice/v1/inference.proto

(`--only` adds the files it imports; the wire lock is checked by the full generation only). Both copies
are generated from the same .proto files, so their serialized descriptors are identical and a process
that imports both (the services re-export the client) shares one set of message classes.

Wire compatibility: `protos/wire_lock.json` records every released field (number, type, label). Generation
merges new fields into it and refuses to run when a locked field was renumbered, retyped or removed.

Why the import rewrite: protoc emits `from apprentice.v1 import common_pb2`, which only works if the
output folder is on sys.path. We keep the stubs inside the `shared` package instead, so imports are
rewritten to `from shared.proto.apprentice.v1 import ...`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
DEFAULT_OUT = ROOT / "shared" / "proto"
PACKAGE_PREFIX = "shared.proto."
LOCK = PROTO_ROOT / "wire_lock.json"
CLIENT_OUT = ROOT / "clients" / "python" / "apprentice_client" / "_proto"
CLIENT_PACKAGE = "apprentice_client._proto."
CLIENT_PROTOS = ["apprentice/v1/inference.proto"]


class WireBreak(Exception):
    """A released field changed: old readers/writers would misread the bytes."""


def describe(fds_bytes: bytes) -> dict[str, dict[str, list]]:
    """FileDescriptorSet bytes --> {message or enum full name: {field: [number, type, label]}}."""
    from google.protobuf import descriptor_pb2

    fds = descriptor_pb2.FileDescriptorSet.FromString(fds_bytes)
    out: dict[str, dict[str, list]] = {}

    def walk(prefix: str, messages, enums) -> None:  # noqa: ANN001
        for e in enums:
            out[f"{prefix}.{e.name}"] = {v.name: [v.number, "enum_value", ""] for v in e.value}
        for m in messages:
            name = f"{prefix}.{m.name}"
            FD = descriptor_pb2.FieldDescriptorProto
            out[name] = {f.name: [f.number, f.type_name.lstrip(".") or FD.Type.Name(f.type),
                                  FD.Label.Name(f.label)] for f in m.field}
            walk(name, m.nested_type, m.enum_type)

    for f in fds.file:
        if f.package.startswith("apprentice."):
            walk(f.package, f.message_type, f.enum_type)
    return out


def check_compatible(locked: dict, current: dict) -> list[str]:
    problems = []
    for msg, fields in locked.items():
        if msg not in current:
            problems.append(f"{msg} was removed")
            continue
        for name, spec in fields.items():
            got = current[msg].get(name)
            if got is None:
                problems.append(f"{msg}.{name} (#{spec[0]}) was removed; reserve it instead")
            elif list(got) != list(spec):
                problems.append(f"{msg}.{name} changed from {spec} to {got}")
        numbers = {v[0]: k for k, v in fields.items()}
        for name, spec in current[msg].items():
            if name not in fields and spec[0] in numbers and spec[2] != "" and spec[1] != "enum_value":
                problems.append(f"{msg}.{name} reuses number {spec[0]} of {numbers[spec[0]]}")
    return problems


def with_imports(files: list[str]) -> list[str]:
    """`files` (paths relative to protos/) and every apprentice .proto they import, transitively."""
    todo, seen = list(files), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        text = (PROTO_ROOT / name).read_text()
        todo += [m for m in re.findall(r'^import\s+"([^"]+)";', text, flags=re.M) if (PROTO_ROOT / m).exists()]
    return sorted(seen)


def generate(out: Path, *, update_lock: bool = True, package_prefix: str = PACKAGE_PREFIX,
             only: list[str] | None = None) -> list[Path]:
    """Stubs of every .proto (or of `only` and their imports) under `out`, imported as `package_prefix`."""
    import grpc_tools
    from grpc_tools import protoc  # dev dependency: only needed when protos change

    files = (with_imports(only) if only else
             sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto")))
    include = str(Path(grpc_tools.__file__).parent / "_proto")
    out.mkdir(parents=True, exist_ok=True)
    fds_path = out / "descriptor_set.tmp"
    args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={out}", f"--pyi_out={out}",
            f"--grpc_python_out={out}", f"--descriptor_set_out={fds_path}", "--include_imports", *files]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    current = describe(fds_path.read_bytes())
    fds_path.unlink()
    locked = json.loads(LOCK.read_text()) if LOCK.exists() and not only else {}
    problems = check_compatible(locked, current)
    if problems:
        raise WireBreak("wire-incompatible proto change:\n  " + "\n  ".join(problems))
    if update_lock and not only:
        merged = {m: {**current[m], **locked.get(m, {})} for m in current}
        lines = [f"  {json.dumps(m)}: {json.dumps(dict(sorted(merged[m].items(), key=lambda kv: kv[1][0])))}"
                 for m in sorted(merged)]
        LOCK.write_text("{\n" + ",\n".join(lines) + "\n}\n")
    written = []
    for path in sorted(out.rglob("*.py*")):
        if path.suffix not in (".py", ".pyi"):
            continue
        text = path.read_text()
        new = re.sub(r"^from apprentice\.", f"from {package_prefix}apprentice.", text, flags=re.M)
        path.write_text(new)
        written.append(path)
    for pkg in (out, out / "apprentice", out / "apprentice" / "v1"):
        init = pkg / "__init__.py"
        if not init.exists():
            init.write_text("")
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=None,
                    help="output folder (default: shared/proto, and the light client's copy)")
    ap.add_argument("--no-lock", action="store_true", help="do not update protos/wire_lock.json")
    ap.add_argument("--package", default=PACKAGE_PREFIX.rstrip("."),
                    help="Python package the output folder is imported as (default: shared.proto)")
    ap.add_argument("--only", action="append", default=None, metavar="FILE",
                    help="generate this .proto (relative to protos/) and its imports; repeatable")
    ns = ap.parse_args(argv)
    jobs = [(ns.out or DEFAULT_OUT, ns.package + ".", ns.only)]
    if ns.out is None and ns.only is None and ns.package + "." == PACKAGE_PREFIX:
        jobs.append((CLIENT_OUT, CLIENT_PACKAGE, CLIENT_PROTOS))
    for out, package, only in jobs:
        try:
            written = generate(out, update_lock=not ns.no_lock, package_prefix=package, only=only)
        except WireBreak as e:
            print(e, file=sys.stderr)
            return 1
        print(f"wrote {len(written)} files under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
