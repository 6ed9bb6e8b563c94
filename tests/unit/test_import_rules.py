"""The layering contracts of pyproject.toml's [tool.importlinter], which `make lint` checks with lint-imports.

Each contract is shown to catch what it forbids: a module that breaks it is written into a copy of the
tree, and lint-imports run on the copy must name that contract as broken. Without this a contract with a
misspelt module name (which lint-imports may accept without a word) would pass forever. The real tree must
keep every contract.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "services", "tools")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS = {c["id"]: c for c in CONFIG["contracts"]}

# contract id -> (module written into the copy, its source): each one breaks that contract alone. The imports
# sit inside functions: a deferred import is a dependency all the same.
VIOLATIONS = {
    "services-independent": ("services/weights/_violation.py",
                             "def f():\n    from services.inference import metrics\n    return metrics\n"),
    "library-below-services-and-tools": ("shared/_violation.py",
                                         "def f():\n    import services.weights.registry\n    import tools.devca\n"),
    "grader-core-without-runtime": ("services/grader/core/_violation.py",
                                    "import faust\n\nfrom services.grader.stream import app\n"),
    "grader-stages-without-app": ("services/grader/stream/_violation.py",
                                  "def f():\n    from services.grader.stream.app import GraderApp\n    return GraderApp\n"),
    "services-without-tools": ("services/trainer/_violation.py", "from tools.devca import DevCredentials\n"),
    "dashboard-imported-by-none": ("tools/stack/_violation.py",
                                   "def f():\n    from services.dashboard import web\n    return web\n"),
    "contracts-lowest": ("shared/contracts/_violation.py", "from shared.kafka import producer\n"),
    # tools/stack already imports tools/broker (the local broker): one import back closes a cycle
    "no-cycles": ("tools/broker/_violation.py", "def f():\n    from tools.stack import stack\n    return stack\n"),
}
CYCLE_REPORTS = {"no-cycles": "No cycles are allowed in tools."}
"""What the report names for an acyclic-siblings contract: the package holding the cycle, not a module."""


def _lint(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """lint-imports on the packages under `root`, with the repository's contracts."""
    args = [str(LINT_IMPORTS), "--no-cache", str(ROOT / "pyproject.toml")]
    for c in contracts:
        args += ["--contract", c]
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The three packages' Python files, copied (what lint-imports reads)."""
    root = tmp_path_factory.mktemp("tree")
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, root / pkg,
                        ignore=lambda d, names: [n for n in names
                                                 if n == "__pycache__" or (Path(d, n).is_file()
                                                                           and not n.endswith(".py"))])
    return root


def test_every_contract_has_a_violation_below() -> None:
    assert set(VIOLATIONS) == set(CONTRACTS)


def test_the_tree_keeps_every_contract() -> None:
    run = _lint(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"Contracts: {len(CONTRACTS)} kept, 0 broken." in run.stdout


@pytest.mark.parametrize("contract", sorted(VIOLATIONS))
def test_a_violation_breaks_its_contract(tree_copy: Path, contract: str) -> None:
    path, source = VIOLATIONS[contract]
    module = tree_copy / path
    assert not module.exists()
    assert _lint(tree_copy, contract).returncode == 0, "the copy must keep the contract before the violation"
    module.write_text(source)
    try:
        run = _lint(tree_copy, contract)
    finally:
        module.unlink()
    assert run.returncode != 0, run.stdout
    name = " ".join(CONTRACTS[contract]["name"].split())
    out = " ".join(run.stdout.split())  # lint-imports wraps long names over lines
    assert f"{name} BROKEN" in out
    dotted = path.removesuffix(".py").replace("/", ".")
    assert CYCLE_REPORTS.get(contract, dotted) in out  # the report names the offending module (or package)


def test_the_contracts_forbid_all_of_the_library_but_the_protos() -> None:
    """contracts-lowest lists the library's modules by name: one added to shared/ must be added there."""
    children = {f"shared.{p.stem}" for p in (ROOT / "shared").iterdir()
                if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert set(CONTRACTS["contracts-lowest"]["forbidden_modules"]) == children - {"shared.contracts",
                                                                                   "shared.proto"}
