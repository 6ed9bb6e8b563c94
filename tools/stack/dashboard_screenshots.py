"""Take the README's pictures of the dashboard with headless Chromium.

    python -m tools.stack.dashboard_screenshots [--out dashboard.png] [--waves 5]
    python -m tools.stack.dashboard_screenshots --stack RUN_DIR --out docs/demo/dashboard.png --page learning,versions
        (writes docs/demo/dashboard-learning.png and docs/demo/dashboard-versions.png)

Without `--stack`: a private stack with the tiny model and a few waves of simulated traffic with KPI
feedback and corrections. With `--stack`: the running stack whose home is RUN_DIR (a demo's run folder or
`.apprentice`), found from its `endpoints.json`, signed in with its operator key. Several pages give one
file each (`dashboard-<page>.png` beside `--out`).

Needs Debian's chromium + chromium-driver and selenium (dev extra); the private stack needs the broker
(`apprentice kafka start`). A tool for people, not a test: it writes where it is told.
"""

from __future__ import annotations

import argparse
import random
import shutil
import ssl
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from shared.contracts.stack_endpoints import read_endpoints
from shared.models import TINY, resolve_model_dir
from shared.proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc
from tools.stack.stack import LocalStack

GRADER_CONFIG = """
version: screenshot
tasks:
  - tenant: demo
    task: support
    feedback_window_s: 3
    graders:
      - {name: resolved, type: kpi, kpi: resolved, map: {1: 1.0, 0: 0.0}, success: true}
      - {name: corrected, type: feedback, kind: correction, weight: 0}
"""
QUESTIONS = ["How long is the warranty on the Ridge tent?", "Can I return worn hiking boots?",
             "Do you ship to Norway?", "What fuel does the Blaze stove take?", "Is the Fjord jacket waterproof?"]


def _wave(stack: Any, wave: int, n: int, rng: random.Random) -> None:
    with stack.channel(stack.inference_target, token=stack.backend_token("demo")) as ch:
        inference, feedback = inference_pb2_grpc.InferenceStub(ch), inference_pb2_grpc.FeedbackStub(ch)
        for i in range(n):
            q = rng.choice(QUESTIONS)
            resp = inference.Generate(inference_pb2.GenerateRequest(
                messages=[common_pb2.ChatMessage(role="user", content=q)], task="support",
                session_id=f"shot-{wave}-{i}", sampling=common_pb2.SamplingParams(max_new_tokens=rng.randint(4, 24))),
                timeout=60)
            iid = resp.choices[0].interaction_id
            resolved = rng.random() < 0.2 + 0.12 * wave
            feedback.Submit(inference_pb2.FeedbackRequest(interaction_id=iid, kind="kpi", kpi_name="resolved",
                                                          value=1.0 if resolved else 0.0), timeout=10)
            if not resolved and i % 3 == 0:
                feedback.Submit(inference_pb2.FeedbackRequest(interaction_id=iid, kind="correction", value=-1.0,
                                                              comment=f"{q} See the product page."), timeout=10)


def photograph(base_url: str, token: str, ca: Path | None, pages: list[str], out: Path) -> list[Path]:
    """Sign in as the operator, then one screenshot per page; returns the files written."""
    # optional: selenium is a dev dependency, only for the screenshots
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    ctx = ssl.create_default_context(cafile=str(ca)) if ca is not None else None
    urllib.request.urlopen(base_url + "login", context=ctx, timeout=10).close()  # it answers before Chromium starts
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,900",
                "--disable-background-networking", "--disable-component-update", "--no-first-run"):
        options.add_argument(arg)
    options.accept_insecure_certs = True
    browser = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    written = []
    try:
        browser.get(base_url + "login")
        browser.find_element("id", "token").send_keys(token)
        browser.find_element("id", "sign-in").click()
        for page in pages:
            browser.get(base_url + ("" if page == "learning" else page))
            time.sleep(4)             # two refreshes: every chart drawn
            path = out if len(pages) == 1 else out.with_name(f"{out.stem}-{page}{out.suffix}")
            path.parent.mkdir(parents=True, exist_ok=True)
            browser.set_window_size(1500, max(900, int(browser.execute_script(
                "return document.body.scrollHeight"))))
            browser.save_screenshot(str(path))
            written.append(path)
    finally:
        browser.quit()
    return written


def _running_stack(home: Path) -> tuple[str, str, Path | None]:
    """(dashboard URL, operator key, CA) of the stack recorded under `home`."""

    ep = read_endpoints(home)
    if ep is None or "dashboard" not in ep.http:
        raise SystemExit(f"no running stack with a dashboard recorded in {home / 'endpoints.json'}")
    if ep.operator_token is None:
        raise SystemExit(f"the stack in {home} has no operator key to sign in with")
    scheme = "https" if ep.tls_ca else "http"
    token = Path(ep.operator_token).read_text().strip()
    return f"{scheme}://localhost:{ep.http['dashboard']}/", token, Path(ep.tls_ca) if ep.tls_ca else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("dashboard.png"))
    ap.add_argument("--stack", type=Path, default=None,
                    help="photograph the running stack whose home is this folder instead of starting one")
    ap.add_argument("--waves", type=int, default=5)
    ap.add_argument("--per-wave", type=int, default=8)
    ap.add_argument("--page", default="learning",
                    help="comma-separated pages: " + ", ".join(("learning", "versions", "hacking", "knowledge",
                                                                "health")))
    ns = ap.parse_args(argv)
    pages = [p.strip() for p in ns.page.split(",") if p.strip()]
    if ns.stack is not None:
        url, token, ca = _running_stack(ns.stack)
        for path in photograph(url, token, ca, pages, ns.out):
            print(f"wrote {path}")
        return 0

    resolve_model_dir(TINY)
    work = Path(tempfile.mkdtemp(prefix="apprentice-dashboard-shot-"))
    (work / "grader.yaml").write_text(GRADER_CONFIG)
    stack = LocalStack(work / "run", TINY, tenants=("demo",), service_env={
        "grader": {"APPRENTICE_GRADER_CONFIG_PATH": str(work / "grader.yaml")},
        "extractor": {"APPRENTICE_EXTRACTOR_SESSION_GAP_S": "1", "APPRENTICE_EXTRACTOR_LLM_ITEMS": "false"},
        "trainer": {"APPRENTICE_TRAINER_TRIGGER_SAMPLES": "100000", "APPRENTICE_TRAINER_TRIGGER_ON_KNOWLEDGE": "false"},
        "dashboard": {"APPRENTICE_DASHBOARD_REFRESH_S": "2", "APPRENTICE_DASHBOARD_BUCKET_S": "10"}})
    stack.start()
    try:
        health = stack.wait_healthy(300)
        if not all(health.values()):
            raise SystemExit(f"the stack did not become healthy: {health}")
        assert stack.creds is not None
        rng = random.Random(0)
        for wave in range(ns.waves):
            _wave(stack, wave, ns.per_wave, rng)
            time.sleep(10)            # one curve bucket per wave
        time.sleep(8)                 # the last wave's feedback window, then a page refresh
        token = stack.creds.token(stack.creds.operator_token)
        for path in photograph(stack.dashboard_url, token, stack.creds.ca, pages, ns.out):
            print(f"wrote {path}")
    finally:
        stack.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
