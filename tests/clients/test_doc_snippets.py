"""Every client snippet of the docs runs, exactly as written, the way a user would run it: in a fresh copy of
the repository (tracked and new files only, plus the dev `.venv`), from its root, in one shell per document
after `eval "$(apprentice env)"`, against the secured inference server of `conftest.server` (keys, TLS, the
tiny model, the real broker), with stock tools: curl, the OpenAI SDK, Node's fetch, the Go toolchain.

Docs rot silently otherwise: the Go steps of clients/README.md failed as written (`clients/go/: No such
file or directory`, plugins installed where PATH did not look, the venv's python assumed), and stock
clients failed with a bare "Connection error." until told the stack's CA.

The rule, checked over README.md, clients/, examples/, docs/, services/*/README.md and tools/*/README.md:
a fenced block in a runnable language (bash/sh/python/js/go...) is preceded by one of
- `<!-- run -->`: run here (bash blocks as shell lines; python and js blocks saved to a file and run with
  `python` / `node`; a go block saved as `main.go` in a folder of its own, `go mod init models && go run .`);
- `<!-- example: PATH -->`: copied from a file under examples/ (test_examples.py runs the file and checks
  the copy);
- `<!-- not run: WHY -->`: not a client snippet, or one needing tools this environment lacks, and why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.clients.conftest import REPO, Server

RUNNABLE = {"bash", "sh", "shell", "console", "python", "py", "js", "javascript", "mjs", "ts", "typescript", "go"}
SHELL = {"bash", "sh", "shell", "console"}
MARK = re.compile(r"^<!--\s*(?P<mark>run|example:\s*\S+|not run:\s*\S.*?)\s*-->\s*$")
ENV_LINE = 'eval "$(apprentice env)"'
"""What a user runs first (`apprentice up` prints it): the stack's CA, address and a backend key."""
RUN_TIMEOUT_S = 900
"""A first run downloads Go modules and npm packages."""


def doc_paths() -> list[str]:
    """The documents whose snippets a user runs: the README, clients/, examples/, docs/, each service's and
    each tool's."""
    found = [REPO / "README.md", REPO / "clients" / "README.md", *sorted((REPO / "clients").glob("*/README.md")),
             REPO / "examples" / "README.md", *sorted((REPO / "docs").glob("*.md")),
             *sorted((REPO / "services").glob("*/README.md")), *sorted((REPO / "tools").glob("*/README.md"))]
    return [str(p.relative_to(REPO)) for p in found if p.is_file()]


@dataclass(frozen=True)
class Block:
    doc: str
    line: int          # of the opening fence, 1-based
    lang: str
    mark: str          # "run", "example: PATH", "not run: WHY" or "" (none)
    code: str


def blocks(doc: str, text: str) -> Iterator[Block]:
    """The fenced code blocks of a Markdown text, each with the marker comment on the line before it."""
    lines = text.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        opening = re.match(r"^```(\S*)", lines[i])
        if not opening:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        mark = MARK.match(lines[i - 1].strip()) if i > 0 else None
        yield Block(doc, i + 1, opening.group(1).lower(), mark["mark"] if mark else "", "".join(lines[i + 1:end]))
        i = end + 1


def run_blocks(doc: str, text: str) -> list[Block]:
    return [b for b in blocks(doc, text) if b.mark == "run"]


def test_every_runnable_block_is_run_or_says_why_not() -> None:
    unmarked = [f"{b.doc}:{b.line} ({b.lang})" for doc in doc_paths()
                for b in blocks(doc, (REPO / doc).read_text()) if b.lang in RUNNABLE and not b.mark]
    assert not unmarked, ("code blocks without <!-- run -->, <!-- example: PATH --> or <!-- not run: WHY --> "
                          f"before them: {unmarked}")
    for doc in doc_paths():
        for b in blocks(doc, (REPO / doc).read_text()):
            if b.mark == "run":
                assert b.lang in RUNNABLE, f"{doc}:{b.line}: <!-- run --> on a ```{b.lang} block"


def script(blocks_: list[Block], folder: Path) -> str:
    """One shell session running `blocks_` in order after the env line; non-shell blocks are saved under
    `folder` and run as their documents say."""
    folder.mkdir(parents=True, exist_ok=True)
    parts = ["set -eo pipefail", ENV_LINE]
    for k, b in enumerate(blocks_):
        parts.append(f"echo '--- {b.doc}:{b.line}' >&2")
        if b.lang in SHELL:
            parts.append(b.code)
        elif b.lang in ("python", "py"):
            (folder / f"snippet{k}.py").write_text(b.code)
            parts.append(f"python {folder / f'snippet{k}.py'}")
        elif b.lang in ("js", "javascript", "mjs"):
            (folder / f"snippet{k}.mjs").write_text(b.code)
            parts.append(f"node {folder / f'snippet{k}.mjs'}")
        elif b.lang == "go":
            (folder / f"go{k}").mkdir()
            (folder / f"go{k}" / "main.go").write_text(b.code)
            parts.append(f"(cd {folder / f'go{k}'} && go mod init models && go run .)")
        else:
            raise AssertionError(f"{b.doc}:{b.line}: no way to run a ```{b.lang} block")
    return "\n".join(parts) + "\n"


def needed_tools(blocks_: list[Block]) -> set[str]:
    tools = set()
    for b in blocks_:
        if b.lang == "go" or re.search(r"(^|[\s(;&])go (install|run|mod|build|-C)\b", b.code):
            tools.add("go")
        if b.lang in ("js", "javascript", "mjs") or re.search(r"(^|[\s(;&])(node|npm) ", b.code):
            tools.update({"node", "npm"})
        if re.search(r"(^|[\s(;&])curl ", b.code):
            tools.add("curl")
    return tools


# --- a user's checkout and shell --------------------------------------------------------------------
@dataclass
class Checkout:
    root: Path
    env: dict[str, str]


def _copy_tree(dest: Path) -> None:
    """The working tree as a fresh clone has it (tracked files, new files git does not ignore), so a step
    that relies on a generated or ignored file fails here as it would for a user."""
    names = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _user_venv(path: Path) -> Path:
    """A virtual environment of the user's (where `pip install` goes), seeing the dev environment's
    packages (`make setup`'s .venv) without changing it."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, capture_output=True)
    site = next((path / "lib").glob("python*/site-packages"))
    (site / "apprentice-dev.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return path / "bin"


@pytest.fixture(scope="session")
def checkout(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Checkout:
    """The copy, `.venv` linked in, `.apprentice/` as `apprentice up` leaves it for this server (its
    secrets with a `default` tenant key, its endpoints record), and the user's environment: PATH with a
    venv of theirs first, the Go toolchain's own GOPATH (the module cache shared, to download once)."""
    from shared.contracts.stack_endpoints import StackEndpoints, write_endpoints
    from tools.devca import ensure_dev_credentials

    tmp = tmp_path_factory.mktemp("checkout")
    root = tmp / "apprentice"
    _copy_tree(root)
    (root / ".venv").symlink_to(REPO / ".venv")
    ensure_dev_credentials(server.creds.directory.parent, tenants=("default",))   # the server re-reads keys.txt
    home = root / ".apprentice"
    shutil.copytree(server.creds.directory, home / "secrets")
    write_endpoints(home, StackEndpoints(
        supervisor_pid=os.getpid(), kafka_bootstrap=server.bootstrap, topic_prefix=server.topics.prefix,
        grpc={"inference": f"127.0.0.1:{server.app.port}"}, http={"openai": server.app.http_port},
        tls_ca=str(home / "secrets" / "ca.pem"), operator_token=str(home / "secrets" / "operator.token")))
    bin_dir = _user_venv(tmp / "user-venv")
    drop = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "OPENAI_BASE_URL",
            "OPENAI_API_KEY", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", "VIRTUAL_ENV", "GOBIN")
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPRENTICE_") and k not in drop}
    env["PATH"] = os.pathsep.join([str(bin_dir), str(REPO / ".venv" / "bin"), env.get("PATH", "")])
    env["VIRTUAL_ENV"] = str(bin_dir.parent)
    if shutil.which("go") is not None:
        cache = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout
        env.update(GOPATH=str(tmp / "gopath"), GOMODCACHE=cache.strip())
    return Checkout(root, env)


def run_doc(doc: str, text: str, checkout: Checkout, folder: Path) -> subprocess.CompletedProcess[str]:
    blocks_ = run_blocks(doc, text)
    for tool in sorted(needed_tools(blocks_)):
        if shutil.which(tool, path=checkout.env["PATH"]) is None:
            pytest.skip(f"{doc} needs `{tool}`, not on PATH")
    return subprocess.run(["bash", "-c", script(blocks_, folder)], cwd=checkout.root, env=checkout.env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


DOCS_WITH_RUNS = [d for d in doc_paths() if run_blocks(d, (REPO / d).read_text())]


@pytest.mark.integration
@pytest.mark.parametrize("doc", DOCS_WITH_RUNS)
def test_doc_snippets_run_as_written(doc: str, checkout: Checkout, tmp_path: Path) -> None:
    proc = run_doc(doc, (checkout.root / doc).read_text(), checkout, tmp_path)
    assert proc.returncode == 0, (f"the snippets of {doc} failed (exit {proc.returncode}); the last one started "
                                  f"is the last '---' line:\n--- stdout\n{proc.stdout[-4000:]}\n"
                                  f"--- stderr\n{proc.stderr[-6000:]}")


def test_the_docs_have_client_snippets_to_run() -> None:
    """The rule above cannot pass vacuously: the documents that show clients have blocks marked to run."""
    assert {"README.md", "clients/README.md", "clients/python/README.md", "examples/README.md",
            "services/inference/README.md"} <= set(DOCS_WITH_RUNS), DOCS_WITH_RUNS


@pytest.mark.integration
def test_plain_http_to_the_api_port_says_how_then_https_works(server: Server, checkout: Checkout) -> None:
    """`curl http://` to the TLS port: a 400 whose body is one line naming the https:// URL and `apprentice
    env`; the port serves TLS clients (curl after the env line) right after."""
    if shutil.which("curl") is None:
        pytest.skip("no curl on PATH")
    port = server.app.http_port
    plain = subprocess.run(["curl", "-sS", "-w", "%{http_code}", f"http://127.0.0.1:{port}/v1/models"],
                           env=checkout.env, capture_output=True, text=True, timeout=60)
    assert plain.stdout == (f"this port speaks HTTPS: use https://127.0.0.1:{port}/v1 and trust the stack's CA "
                            f"({ENV_LINE})\n400"), (plain.stdout, plain.stderr)
    tls = subprocess.run(["bash", "-c", f"set -e\n{ENV_LINE}\n"
                          'curl -fsS "$OPENAI_BASE_URL/models" -H "Authorization: Bearer $OPENAI_API_KEY"'],
                         cwd=checkout.root, env=checkout.env, capture_output=True, text=True, timeout=60)
    assert tls.returncode == 0 and '"data"' in tls.stdout, (tls.stdout, tls.stderr)
