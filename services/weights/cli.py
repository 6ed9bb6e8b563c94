"""`apprentice weights list|get|promote|canary|rollback|status|pin|unpin` --> gRPC calls to the Weights service.

The endpoint is `--endpoint`, else APPRENTICE_WEIGHTS_ENDPOINT, else the running stack's (recorded by
`apprentice up` in its home: shared/contracts/stack_endpoints.py), else 127.0.0.1:50052; the model defaults to
APPRENTICE_MODEL, else the running stack's.
Exit codes: 0 ok, 1 the service refused (the message says why), 2 bad usage, 3 the service is unreachable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any

import grpc

from shared.contracts.events import to_dict, to_json
from shared.contracts.orders import BASE
from shared.proto.apprentice.v1 import weights_pb2, weights_pb2_grpc
from shared.proto.apprentice.v1 import weights_pb2 as W
from shared.security.channels import open_channel
from shared.settings import CommonSettings
from shared.unreachable import grpc_unreachable_reason, unreachable

DEFAULT_ENDPOINT = "127.0.0.1:50052"
MAX_MESSAGE = 64 << 20
"""The server's send limit (shared/rpc/grpc_util.py): gRPC's 4 MiB default made one large answer (a List of
many versions) fail with RESOURCE_EXHAUSTED; each manifest is itself bounded (services/weights/metadata.py)."""


def _parser() -> argparse.ArgumentParser:
    # The common options are accepted before or after the command (`weights --model m list` or `list --model m`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--endpoint", default=argparse.SUPPRESS,
                        help=f"host:port (default: APPRENTICE_WEIGHTS_ENDPOINT, the running stack's, or {DEFAULT_ENDPOINT})")
    common.add_argument("--model", default=argparse.SUPPRESS, help="model name (default: APPRENTICE_MODEL)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print protobuf JSON")
    common.add_argument("--timeout", type=float, default=argparse.SUPPRESS,
                        help="seconds (default 600: promote may run the eval gate)")
    p = argparse.ArgumentParser(prog="apprentice weights", parents=[common],
                                description="Model versions: list, promote, canary, roll back, pod status.")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def cmd(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_text, parents=[common])

    cmd("list", "every stored version, oldest first")
    g = cmd("get", "one version's manifest (files, eval results)")
    g.add_argument("version")
    pr = cmd("promote", "serve a version to its tenant (runs the eval gate if needed)")
    pr.add_argument("version")
    pr.add_argument("--force", action="store_true", help="skip the eval gate (logged)")
    pr.add_argument("--reason", default="")
    ca = cmd("canary", "serve a version to a fraction of its tenant's requests")
    ca.add_argument("version")
    ca.add_argument("--fraction", type=float, required=True)
    ca.add_argument("--reason", default="")
    rb = cmd("rollback", "go back to the previous promoted version (or --version)")
    rb.add_argument("--version", default="")
    rb.add_argument("--tenant", default=None, help='tenant slot ("" = the operator slot)')
    rb.add_argument("--reason", default="")
    cmd("status", "what each inference pod serves; convergence and lagging pods")
    for name in ("pin", "unpin"):
        x = cmd(name, f"{name} a version ({'kept by' if name == 'pin' else 'released to'} retention)")
        x.add_argument("version")
    return p


def _status_name(v: int) -> str:
    return weights_pb2.VersionStatus.Name(v).removeprefix("VERSION_STATUS_").lower()


def _when(ts: Any) -> str:
    if not ts.seconds:
        return "-"
    return datetime.fromtimestamp(ts.seconds, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _print_table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _serving(stub: Any, model: str, timeout: float) -> dict[str, str]:
    """Tenant slot ("" = every tenant) -> the version it serves, from Status; {} when Status is refused
    (`list` still lists)."""

    try:
        return dict(stub.Status(W.StatusRequest(model=model), timeout=timeout).tenant_versions)
    except grpc.RpcError:
        return {}


def _serving_text(serving: dict[str, str]) -> str:
    if not serving:
        return "unknown"
    return ", ".join(f"{v or BASE} for {'every tenant' if not k else 'tenant ' + k}" for k, v in sorted(serving.items()))


def list_json(model: str, resp: Any, serving: dict[str, str]) -> dict[str, Any]:
    """`list --json`: one shape whether or not anything was trained. The base model is always the first
    entry of `versions` (it is always available, though the store holds trained versions only), so an empty
    store is `{"versions": [base]}` rather than `{}`; `serving` is each tenant slot's version ("" = every
    tenant)."""

    base = {"model": model, "version": BASE, "kind": BASE}
    return {"model": model, "serving": {k: v or BASE for k, v in serving.items()},
            "versions": [base, *to_dict(resp).get("versions", [])]}


def _run(ns: argparse.Namespace, stub: Any) -> int:
    model, t = ns.model, ns.timeout
    if ns.cmd == "list":
        resp = stub.List(W.ListVersionsRequest(model=model), timeout=t)
        serving = _serving(stub, model, t)
        if ns.json:
            print(json.dumps(list_json(model, resp, serving), ensure_ascii=False))
            return 0
        if not resp.versions:  # the store holds trained versions only: a bare header read as "broken"
            print(f"only the base model {model}; no trained versions yet (serving: {_serving_text(serving)})")
            return 0
        rows = [["VERSION", "STATUS", "KIND", "TENANT", "PARENT", "CREATED", "SIZE", "PIN", "REASON"]]
        for m in resp.versions:
            rows.append([m.version, _status_name(m.status), m.kind, m.tenant or "*", m.parent_version or "-",
                         _when(m.created_at), f"{sum(f.size for f in m.files) / 1e6:.1f}MB",
                         "yes" if m.pinned else "", m.status_reason[:60]])
        _print_table(rows)
        return 0
    if ns.cmd == "get":
        print(to_json(stub.Get(W.GetVersionRequest(model=model, version=ns.version), timeout=t)))
        return 0
    if ns.cmd in ("pin", "unpin"):
        m = stub.Pin(W.PinRequest(model=model, version=ns.version, pinned=ns.cmd == "pin"), timeout=t)
        print(to_json(m) if ns.json else f"{m.model} {m.version} pinned={m.pinned}")
        return 0
    if ns.cmd == "status":
        st = stub.Status(W.StatusRequest(model=model), timeout=t)
        if ns.json:
            print(to_json(st))
            return 0
        slots = ", ".join(f"{k or '*'}={v}" for k, v in sorted(st.tenant_versions.items()))
        canaries = ", ".join(f"{k or '*'}={v}" for k, v in sorted(st.tenant_canaries.items())) or "none"
        print(f"model {st.model}: promoted {slots}; canary {canaries}; "
              f"{'CONVERGED' if st.converged else 'NOT CONVERGED'} ({st.lagging_pods} lagging)")
        if st.pods:
            rows = [["POD", "SERVES", "CANARY", "CONVERGED", "LAGGING", "AGE", "DETAIL / ERROR"]]
            for p in st.pods:
                rows.append([p.pod_id, p.serving_version or "?", p.canary_version or "-",
                             "yes" if p.converged else "no", "LAGGING" if p.lagging else "",
                             f"{p.heartbeat_age_s:.0f}s", (p.detail + (f" | {p.last_error}" if p.last_error else ""))])
            _print_table(rows)
        return 0 if not st.lagging_pods else 1
    if ns.cmd == "promote":
        ack = stub.Promote(W.PromoteRequest(model=model, version=ns.version, force=ns.force, reason=ns.reason),
                           timeout=t)
    elif ns.cmd == "canary":
        ack = stub.Canary(W.CanaryRequest(model=model, version=ns.version, fraction=ns.fraction, reason=ns.reason),
                          timeout=t)
    else:
        req = W.RollbackRequest(model=model, version=ns.version, reason=ns.reason)
        if ns.tenant is not None:
            req.tenant = ns.tenant
        ack = stub.Rollback(req, timeout=t)
    print(to_json(ack) if ns.json else f"{ack.action} {ack.model} {ack.version}: order {ack.order_id} sent")
    return 0


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    ns.endpoint = getattr(ns, "endpoint", None) or os.environ.get("APPRENTICE_WEIGHTS_ENDPOINT", DEFAULT_ENDPOINT)
    ns.json = getattr(ns, "json", False)
    ns.timeout = getattr(ns, "timeout", 600.0)
    ns.model = getattr(ns, "model", None)

    if ns.model is None:
        ns.model = CommonSettings().model
    with open_channel(ns.endpoint, options=[("grpc.max_receive_message_length", MAX_MESSAGE)]) as channel:
        try:
            return _run(ns, weights_pb2_grpc.WeightsStub(channel))
        except grpc.RpcError as e:
            code = e.code()
            reason = grpc_unreachable_reason(e)
            if reason is not None:  # the stack is down (or elsewhere): say which service, where, what to do
                print(f"apprentice weights {ns.cmd}: {unreachable('weights', ns.endpoint, reason)}", file=sys.stderr)
                return 3
            print(f"apprentice weights {ns.cmd}: {code.name}: {e.details()}", file=sys.stderr)
            return 3 if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else 1


if __name__ == "__main__":
    raise SystemExit(main())
