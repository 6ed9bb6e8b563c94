"""Record-signing keys in the deployments (SECURITY.md, "Record signatures"): every workload that signs
records holds its own private key and no other's, and every workload holds every public key.

Why a test: a mount copied from one service's template to another (or a whole keys directory mounted
everywhere) would let one compromised pod sign as any principal, which is exactly what per-principal
keys exist to prevent; nothing at run time notices (the pod simply has one key too many).

Compose: the files, and the folders `python -m tools.record_keys layout` writes for its volume.
Helm: the rendered chart (helm built as tests/deploy/test_helm.py builds it)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from shared.kafka.signing import KeyRing, load_signer
from tests.deploy.test_helm import CHART, FULL, KUBE_VERSIONS, NAMESPACE, RELEASE, _build_helm
from tools import record_keys

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "compose" / "docker-compose.yml"
SERVICES = ("inference", "grader", "extractor", "trainer", "weights", "dashboard")


# --- compose ------------------------------------------------------------------------------------------

def _principal(spec: dict[str, Any]) -> str:
    return str(spec["environment"]["APPRENTICE_KAFKA_SASL_USERNAME"])


def test_compose_every_service_mounts_its_own_record_keys_folder_alone() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    checked = 0
    for name, spec in services.items():
        if spec.get("command", [None])[0] not in ("serve", "dashboard"):
            continue
        principal = _principal(spec)
        mounts = [v for v in spec["volumes"] if isinstance(v, dict) and v.get("source") == "record-keys"]
        assert mounts == [{"type": "volume", "source": "record-keys", "target": "/run/records", "read_only": True,
                           "volume": {"subpath": principal}}], f"{name}: {mounts}"
        assert not any(isinstance(v, str) and v.startswith("record-keys:") for v in spec["volumes"]), name
        assert spec["environment"]["APPRENTICE_RECORD_KEYS_DIR"] == "/run/records", name
        assert "record-keys-init" in spec["depends_on"], name
        checked += 1
    assert checked == len(SERVICES) + 1  # inference-gpu too
    init = services["record-keys-init"]
    assert init["entrypoint"] == ["python", "-m", "tools.record_keys", "layout", "/record-keys"]


def test_compose_layout_gives_each_principal_its_own_key_and_every_public_key(tmp_path: Path) -> None:
    root = tmp_path / "record-keys"
    assert record_keys.layout(root) == list(record_keys.SIGNERS)
    for principal in SERVICES:
        folder = root / principal
        keys = sorted(p.name for p in folder.glob("*.key"))
        assert keys == ([f"{principal}.key"] if principal in record_keys.SIGNERS else []), (principal, keys)
        ring = KeyRing.load(folder)
        for signer in record_keys.SIGNERS:  # every public key, usable as the service's keys directory
            s = load_signer(root / record_keys.MASTER, signer)
            assert ring.get(signer, s.key_id) is not None, (principal, signer)
        if principal in record_keys.SIGNERS:
            assert load_signer(folder, principal).key_id == load_signer(root / record_keys.MASTER, principal).key_id
    # a rotation in _pairs reaches the folders on the next run; a retired .pub leaves them
    old = load_signer(root / record_keys.MASTER, "grader").key_id
    new = record_keys.rotate(root / record_keys.MASTER, "grader")
    assert record_keys.layout(root) == []
    assert load_signer(root / "grader", "grader").key_id == new
    assert {old, new} <= set(record_keys.public_keys(root / "inference")["grader"])
    record_keys.retire(root / record_keys.MASTER, f"grader@{old}")
    record_keys.layout(root)
    assert record_keys.public_keys(root / "inference")["grader"] == [new]
    with pytest.raises(ValueError, match="signs with now"):
        record_keys.retire(root / record_keys.MASTER, f"grader@{new}")


# --- helm ---------------------------------------------------------------------------------------------

def _render(tmp: Path, *extra: str, keys: Path | None = None) -> list[dict[str, Any]]:
    """The chart rendered with the public keys `helm-values` prints for `keys` (written now if None)."""
    if keys is None:
        keys = tmp / "keys"
        record_keys.ensure(keys)
    values = tmp / "record-keys.yaml"
    values.write_text(record_keys.helm_values(keys))
    helm = _build_helm()
    res = subprocess.run([str(helm), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(values),
                          "--kube-version", KUBE_VERSIONS[0], *extra], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


@pytest.mark.timeout(1800)  # the first run on a machine builds helm
def test_helm_every_deployment_mounts_exactly_its_own_private_key(tmp_path: Path) -> None:
    docs = _render(tmp_path)
    pubs = sorted(p.name for p in (tmp_path / "keys").glob("*@*.pub"))
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == f"{FULL}-record-keys"]
    assert sorted(configmap["data"]) == sorted(n.replace("@", ".") for n in pubs)
    assert not any(k.endswith(".key") for k in configmap["data"]), "a private key in the ConfigMap"
    # the mounted files are what the services read: a KeyRing over them trusts every signer's current key
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    for name in pubs:
        (mounted / name).write_text(configmap["data"][name.replace("@", ".")])
    ring = KeyRing.load(mounted)
    for signer in record_keys.SIGNERS:
        assert ring.get(signer, load_signer(tmp_path / "keys", signer).key_id) is not None, signer
    seen = set()
    for d in docs:
        if d["kind"] != "Deployment":
            continue
        pod = d["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        principal = env["APPRENTICE_KAFKA_SASL_USERNAME"] if "APPRENTICE_KAFKA_SASL_USERNAME" in env else \
            d["metadata"]["labels"]["app.kubernetes.io/component"]
        assert env["APPRENTICE_RECORD_KEYS_DIR"] == "/secrets/records" and env["APPRENTICE_RECORD_SIGNATURES"] == "required"
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "record-keys"]
        assert mount == {"name": "record-keys", "mountPath": "/secrets/records", "readOnly": True}
        (volume,) = [v for v in pod["volumes"] if v["name"] == "record-keys"]
        sources = volume["projected"]["sources"]
        (cm,) = [src["configMap"] for src in sources if "configMap" in src]
        assert cm["name"] == f"{FULL}-record-keys"
        assert sorted(i["path"] for i in cm["items"]) == pubs, principal   # every public key, as KeyRing names them
        secrets = [s["secret"] for s in sources if "secret" in s]
        if principal in record_keys.SIGNERS:
            assert secrets == [{"name": f"apprentice-record-key-{principal}",
                                "items": [{"key": f"{principal}.key", "path": f"{principal}.key"}]}], principal
        else:
            assert secrets == [], f"{principal} signs nothing but mounts {secrets}"
        # no other volume of the pod brings a private key in
        others = [v for v in pod["volumes"] if v["name"] != "record-keys" and "record-key" in yaml.safe_dump(v)]
        assert others == [], others
        seen.add(principal)
    assert seen == set(SERVICES)


@pytest.mark.timeout(1800)
def test_helm_signatures_off_mounts_no_keys(tmp_path: Path) -> None:
    docs = _render(tmp_path, "--set", "recordKeys.signatures=off")
    for d in docs:
        if d["kind"] == "Deployment":
            pod = d["spec"]["template"]["spec"]
            assert not [v for v in pod["volumes"] if v["name"] == "record-keys"]
            env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
            assert env["APPRENTICE_RECORD_SIGNATURES"] == "off" and "APPRENTICE_RECORD_KEYS_DIR" not in env
