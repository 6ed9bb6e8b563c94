"""The protos generate working stubs in other backend languages, with the toolchains of this machine:

- Go: protoc-gen-go and protoc-gen-go-grpc from the Go module proxy (`go install`), grpcio-tools' protoc;
  the package lands at its `go_package` path and `go build` / `go vet` pass.
- Java: protoc and the grpc-java plugin executables from Maven Central (`mvn dependency:copy`; grpcio-tools'
  protoc has no Java generator), classes in `dev.apprentice.v1`; Maven compiles them with a class that
  uses them against grpc-stub, grpc-protobuf and protobuf-java of the protoc's version, then runs it.

Downloads are cached (Go module cache, ~/.m2). A missing toolchain skips its test with the reason.
Warm, the module takes under two minutes on a busy 2-core machine (Maven's JVM starts dominate), so it is
not marked slow; cold, the downloads add a few minutes.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.clients.conftest import GO_MODULE, PROTOS, WELL_KNOWN, GoStubs, proto_files, protoc_version, run

HERE = Path(__file__).resolve().parent
GRPC_JAVA = "1.83.1"
"""grpc-java of the plugin and runtime: the newest whose `protoc-gen-grpc-java` executables are on Maven
Central (those of 1.84.0 and later were not, when this was written)."""


def test_go_stubs_build_at_their_go_package(go_stubs: GoStubs) -> None:
    pkg = go_stubs.module / "apprentice" / "v1"
    names = {p.name for p in pkg.glob("*.go")}
    for proto in proto_files():
        stem = Path(proto).stem
        assert f"{stem}.pb.go" in names, sorted(names)
    assert {"inference_grpc.pb.go", "weights_grpc.pb.go", "knowledge_grpc.pb.go"} <= names
    assert "package apprenticev1" in (pkg / "inference.pb.go").read_text()
    run(["go", "build", "./..."], cwd=go_stubs.module, env=go_stubs.env)
    run(["go", "vet", "./..."], cwd=go_stubs.module, env=go_stubs.env)
    listed = run(["go", "list", "./..."], cwd=go_stubs.module, env=go_stubs.env).stdout.split()
    assert listed == [f"{GO_MODULE}/apprentice/v1"]


def test_java_stubs_compile_and_run(tmp_path: Path) -> None:
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            pytest.skip(f"no Java toolchain (`{tool}`) on PATH")
    pom = HERE / "java" / "pom.xml"
    protobuf_java = f"4.{protoc_version()}"        # protoc 35.1 <-> protobuf-java 4.35.1
    tools = tmp_path / "tools"
    mvn = ["mvn", "-B", "-q", "-f", str(pom), f"-Dgrpc.version={GRPC_JAVA}", f"-Dprotobuf.version={protobuf_java}"]
    for artifact in (f"com.google.protobuf:protoc:{protobuf_java}:exe:linux-x86_64",
                     f"io.grpc:protoc-gen-grpc-java:{GRPC_JAVA}:exe:linux-x86_64"):
        run([*mvn, "dependency:copy", f"-Dartifact={artifact}", f"-DoutputDirectory={tools}"])
    protoc = tools / f"protoc-{protobuf_java}-linux-x86_64.exe"
    plugin = tools / f"protoc-gen-grpc-java-{GRPC_JAVA}-linux-x86_64.exe"
    for exe in (protoc, plugin):
        exe.chmod(0o755)
    src = tmp_path / "src"
    src.mkdir()
    run([str(protoc), f"-I{PROTOS}", f"-I{WELL_KNOWN}", f"--plugin=protoc-gen-grpc-java={plugin}",
         f"--java_out={src}", f"--grpc-java_out={src}", *proto_files()])
    generated = src / "dev" / "apprentice" / "v1"
    assert {"InferenceGrpc.java", "FeedbackGrpc.java", "WeightsGrpc.java", "KnowledgeGrpc.java",
            "GenerateRequest.java", "InferenceProto.java"} <= {p.name for p in generated.glob("*.java")}
    check_dir = src / "dev" / "apprentice" / "check"
    check_dir.mkdir(parents=True)
    shutil.copy(HERE / "java" / "Check.java", check_dir / "Check.java")
    target = tmp_path / "target"
    classpath_file = tmp_path / "classpath.txt"
    run([*mvn, f"-Dgen.dir={src}", f"-Dbuild.dir={target}", "compile", "dependency:build-classpath",
         f"-Dmdep.outputFile={classpath_file}"])
    classpath = os.pathsep.join([str(target / "classes"), classpath_file.read_text().strip()])
    out = run(["java", "-cp", classpath, "dev.apprentice.check.Check"]).stdout
    assert out.split() == ["apprentice.v1.Inference/Generate", "apprentice.v1.Feedback/Submit", "Where", "is", "my",
                           "order?"]
