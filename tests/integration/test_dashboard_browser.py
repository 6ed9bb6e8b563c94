"""The dashboard in headless Chromium against a real private stack (five services + dashboard as supervised
processes, the real broker, tiny model, TLS and keys on): the operator signs in with the operator key,
every page renders, a reward curve gets points once traffic is served, fed back and graded (a 3 s feedback
window), and an approval clicked on the knowledge page reaches the Knowledge service (read back over its
gRPC API), as do retiring it and undoing that (restore). Every page is watched through several refreshes
(one a second here) and fails the test on any browser console error or error box; the time charts' x axes
span the minutes around their buckets (ms since the epoch), not years.

Needs Debian's `chromium` and `chromium-driver` (`make setup` installs them where apt-get is usable) and
the `selenium` package; skipped with the reason otherwise. Part of `make test` (about 50 s: starting six
processes, then a few seconds of refreshes per page); `make test-browser` runs it alone.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.waiting import wait_for

pytestmark = [pytest.mark.integration]

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"

GRADER_CONFIG = """
version: dashboard-it
tasks:
  - tenant: demo
    task: support
    feedback_window_s: 3
    graders:
      - {name: resolved, type: kpi, kpi: resolved, map: {1: 1.0, 0: 0.0}, success: true}
      - {name: corrected, type: feedback, kind: correction, weight: 0}
"""


LOADING = (Exception,)
"""What a probe of a page still loading may raise (a missing element, a stale one, a refused connection)."""


def _browser() -> Any:
    if not (Path(CHROMIUM).exists() and Path(DRIVER).exists()):
        pytest.skip(f"needs Debian's chromium and chromium-driver ({CHROMIUM}, {DRIVER}): "
                    "`apt-get install -y chromium chromium-driver` (make setup does it where apt-get is usable)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs the selenium package (pyproject dev extra)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
                "--window-size=1400,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})    # console messages and uncaught errors
    options.accept_insecure_certs = True    # the stack's development CA is not in the browser's store
    return webdriver.Chrome(service=Service(DRIVER), options=options)


@pytest.fixture
def stack(kafka_bootstrap: str, tiny_model_name: str, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from tools.stack.stack import LocalStack

    monkeypatch.setenv("APPRENTICE_KAFKA_BOOTSTRAP", kafka_bootstrap)
    config = tmp_path / "grader.yaml"
    config.write_text(GRADER_CONFIG)
    s = LocalStack(tmp_path / "run", tiny_model_name, tenants=("demo",), service_env={
        "grader": {"APPRENTICE_GRADER_CONFIG_PATH": str(config)},
        "extractor": {"APPRENTICE_EXTRACTOR_SESSION_GAP_S": "1", "APPRENTICE_EXTRACTOR_LLM_ITEMS": "false"},
        # no training in this test: it only needs graded records and proposals
        "trainer": {"APPRENTICE_TRAINER_TRIGGER_SAMPLES": "100000", "APPRENTICE_TRAINER_TRIGGER_ON_KNOWLEDGE": "false"},
        "dashboard": {"APPRENTICE_DASHBOARD_REFRESH_S": "1", "APPRENTICE_DASHBOARD_BUCKET_S": "10"},
        **{n: {"APPRENTICE_TORCH_THREADS": "1"} for n in ("inference", "weights", "trainer")}})
    s.start()
    try:
        health = s.wait_healthy(240)
        assert all(health.values()), (health, s.crashed())
        yield s
    finally:
        s.stop()


def _dashboard_up(url: str, ca: Path) -> bool:
    import ssl

    ctx = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(url + "login", context=ctx, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _traffic(stack: Any, n: int) -> list[str]:
    """`n` answers for tenant demo, each resolved (KPI 1) or not, the unresolved ones corrected."""
    from shared.proto.apprentice.v1 import common_pb2, inference_pb2, inference_pb2_grpc

    ids = []
    with stack.channel(stack.inference_target, token=stack.backend_token("demo")) as ch:
        inference, feedback = inference_pb2_grpc.InferenceStub(ch), inference_pb2_grpc.FeedbackStub(ch)
        for i in range(n):
            resp = inference.Generate(inference_pb2.GenerateRequest(
                messages=[common_pb2.ChatMessage(role="user", content=f"How long is the warranty on tent {i}?")],
                task="support", session_id=f"dash-{i}", sampling=common_pb2.SamplingParams(max_new_tokens=6)),
                timeout=60)
            iid = resp.choices[0].interaction_id
            ids.append(iid)
            resolved = i % 2 == 0
            feedback.Submit(inference_pb2.FeedbackRequest(interaction_id=iid, kind="kpi", kpi_name="resolved",
                                                          value=1.0 if resolved else 0.0), timeout=10)
            if not resolved:
                feedback.Submit(inference_pb2.FeedbackRequest(
                    interaction_id=iid, kind="correction", value=-1.0,
                    comment=f"Tent {i} has a warranty of {20 + i} months."), timeout=10)
    return ids


COUNT_REFRESHES = """
window.__refreshes = 0;
const fetched = window.fetch;
window.fetch = async (...args) => {
  const response = await fetched(...args);
  if (String(args[0]).startsWith("/api/") && !(args[1] && args[1].method === "POST")) window.__refreshes += 1;
  return response;
};
"""
"""Counts the page's data fetches (one per refresh), installed by the test after the page loaded."""

REFRESHES = 4
"""Refreshes each page is watched through (the stack refreshes every second)."""


def _console_errors(browser: Any) -> list[str]:
    """The browser's SEVERE log entries since the last call (console.error, uncaught exceptions, failed loads)."""
    return [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def _stays_clean(browser: Any, page: str) -> None:
    """Stay on the current page through REFRESHES refreshes: no console error, no error box, and every
    refresh still draws (the page's `data-loaded` stamp moves on)."""
    from selenium.webdriver.common.by import By

    loaded = browser.execute_script("return document.body.dataset.loaded || ''")
    browser.execute_script(COUNT_REFRESHES)
    wait_for(lambda: browser.execute_script("return window.__refreshes") >= REFRESHES,
             what=f"{REFRESHES} refreshes of the {page} page", stall_s=10 + 3 * REFRESHES, every=0.2)
    errors = _console_errors(browser)
    assert not errors, f"the {page} page logged errors while refreshing: {errors}"
    box = browser.find_element(By.ID, "error")
    assert not box.is_displayed(), f"the {page} page shows an error: {box.text}"
    assert browser.execute_script("return document.body.dataset.loaded || ''") != loaded, \
        f"the {page} page stopped drawing its refreshes"


X_AXIS = """
const chart = Chart.getChart(arguments[0]);
return {min: chart.scales.x.min, max: chart.scales.x.max, now: Date.now(),
        ticks: chart.scales.x.ticks.map((t) => t.value),
        xs: chart.data.datasets.flatMap((d) => d.data.map((p) => p.x))};
"""
"""The drawn x range of a time chart, its ticks and its points' x values (ms since the epoch)."""


def _time_axis_fits(browser: Any, canvas: Any, what: str) -> None:
    """The chart's x axis spans minutes around its points (not years), its points at about now, its ticks
    on whole seconds at even steps."""
    axis = browser.execute_script(X_AXIS, canvas)
    assert axis["xs"], (what, axis)
    assert 0 < axis["max"] - axis["min"] <= 3600_000, (what, axis)
    assert all(axis["min"] < x < axis["max"] for x in axis["xs"]), (what, axis)
    assert all(abs(x - axis["now"]) < 600_000 for x in axis["xs"]), (what, axis)
    ticks = axis["ticks"]
    assert len(ticks) >= 2 and all(t % 1000 == 0 for t in ticks), (what, axis)
    assert len({b - a for a, b in zip(ticks, ticks[1:], strict=False)}) == 1, (what, axis)


def test_dashboard_pages_curve_and_approval(stack: Any) -> None:
    from selenium.webdriver.common.by import By

    from shared.proto.apprentice.v1 import events_pb2, knowledge_pb2, knowledge_pb2_grpc

    url = stack.dashboard_url
    assert stack.creds is not None
    wait_for(lambda: _dashboard_up(url, stack.creds.ca), what="the dashboard answers", stall_s=90, every=0.5,
             ignore=LOADING)
    operator_key = stack.creds.token(stack.creds.operator_token)
    browser = _browser()

    def click(selector: str) -> bool:
        """Click what `selector` finds (a redraw may replace it under us: wait_for retries)."""
        browser.find_element(By.CSS_SELECTOR, selector).click()
        return True
    try:
        browser.get(url)                                     # not signed in: the sign-in form
        assert browser.current_url.endswith("/login")
        browser.find_element(By.ID, "token").send_keys("not-the-operator-key-000")
        browser.find_element(By.ID, "sign-in").click()
        # the refused sign-in answers with a new page: wait for it rather than race the navigation
        refused = wait_for(partial(browser.find_elements, By.ID, "login-error"), what="the refused sign-in's message",
                           stall_s=15, every=0.2, ignore=LOADING)
        assert "unknown or revoked key" in refused[0].text
        browser.find_element(By.ID, "token").send_keys(operator_key)
        browser.find_element(By.ID, "sign-in").click()
        wait_for(lambda: browser.find_elements(By.ID, "learning"), what="the learning page", stall_s=10, every=0.2,
                 ignore=LOADING)
        assert browser.get_cookie("apprentice_dashboard")["httpOnly"]
        _console_errors(browser)                             # the refused sign-in's 401 is expected

        _traffic(stack, 6)
        # graded after the 3 s window: the page's next refreshes draw the reward curve of tenant demo, base
        canvas = wait_for(lambda: [
            c for c in browser.find_elements(By.CSS_SELECTOR, "canvas[id^='reward-demo']")
            if int(c.get_attribute("data-points") or 0) > 0], what="points on the reward curve", stall_s=90,
            every=0.5, ignore=LOADING)
        assert canvas[0].is_displayed()
        summary = wait_for(lambda: (lambda t: t if "6 graded" in t else None)(
            browser.find_element(By.CSS_SELECTOR, "section.curve .summary").text),
            what="every answer graded on the page", stall_s=60, every=0.5, ignore=LOADING)
        assert "versions: base (6)" in summary, summary
        _time_axis_fits(browser, canvas[0], "the reward curve")
        _stays_clean(browser, "learning")

        for page, element in (("versions", "promoted"), ("hacking", "hacking"), ("health", "service-weights"),
                              ("knowledge", "knowledge")):
            browser.find_element(By.ID, f"nav-{page}").click()
            wait_for(partial(browser.find_elements, By.ID, element), what=f"the {page} page drawn", stall_s=15,
                     every=0.2, ignore=LOADING)
            if page == "hacking":
                hacking = wait_for(partial(browser.find_elements, By.CSS_SELECTOR, "canvas[id^='hacking-demo']"),
                                   what="the hacking chart of tenant demo", stall_s=15, every=0.2, ignore=LOADING)
                _time_axis_fits(browser, hacking[0], "the hacking chart")
            _stays_clean(browser, page)
        browser.find_element(By.ID, "nav-health").click()
        wait_for(lambda: all(
            "healthy" in browser.find_element(By.ID, f"service-{n}").text
            for n in ("inference", "grader", "extractor", "trainer", "weights")),
            what="every service healthy on the health page", stall_s=20, every=0.5, ignore=LOADING)
        browser.find_element(By.ID, "nav-versions").click()
        assert wait_for(lambda: browser.find_element(By.ID, "promoted").text, what="the promoted version", stall_s=15,
                        every=0.5, ignore=LOADING) == "base"

        # the corrections became proposals (approval required for backend-sourced items): approve one
        browser.find_element(By.ID, "nav-knowledge").click()
        row = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.item-proposed"),
                       what="a proposed knowledge item", stall_s=90, every=0.5, ignore=LOADING)
        item_id = row[0].get_attribute("data-item")
        key = browser.find_element(By.CSS_SELECTOR, "section.base").get_attribute("data-key")
        row[0].find_element(By.CSS_SELECTOR, "button.approve").click()

        def approved_row() -> tuple[str, int] | None:
            """The approved row's status text and its approve/restore buttons, read from one drawing of it."""
            rows = browser.find_elements(By.CSS_SELECTOR, f"tr.item-approved[data-item='{item_id}']")
            if not rows:
                return None
            status = rows[0].find_element(By.CSS_SELECTOR, "td.status-approved").text
            return status, len(rows[0].find_elements(By.CSS_SELECTOR, "button.approve, button.restore"))
        # read inside the wait: the page's refresh may redraw the row between two reads (a stale element)
        status, offered = wait_for(approved_row, what="the item shown approved", stall_s=20, every=0.3,
                                   ignore=LOADING)
        assert status.startswith("serving in context"), status
        # retire it (after the confirmation), then undo that: the actions offered follow the item's state
        assert offered == 0
        for action, shown in (("retire", "retired"), ("restore", "approved")):
            wait_for(partial(click, f"tr[data-item='{item_id}'] button.{action}"), what=f"the {action} button",
                     stall_s=20, every=0.3, ignore=LOADING)
            wait_for(partial(click, "#confirm-ok"), what="the confirmation", stall_s=10, every=0.2, ignore=LOADING)
            wait_for(partial(browser.find_elements, By.CSS_SELECTOR, f"tr.item-{shown}[data-item='{item_id}']"),
                     what=f"the item shown {shown}", stall_s=20, every=0.3, ignore=LOADING)
        counts = wait_for(lambda: (lambda t: t if "retired: 0" in t else None)(
            browser.find_element(By.CSS_SELECTOR, "section.base p.counts").text), what="the counts redrawn",
            stall_s=20, every=0.3, ignore=LOADING)
        assert "serving in context: 1" in counts, counts
    finally:
        browser.quit()

    with stack.channel(stack.knowledge_target) as ch:
        snap = knowledge_pb2_grpc.KnowledgeStub(ch).Get(knowledge_pb2.GetKnowledgeRequest(key=key), timeout=10)
    item = next(i for i in snap.items if i.item_id == item_id)
    assert item.status == events_pb2.ITEM_STATUS_APPROVED
    reviews = [(p.action, p.principal.role) for p in item.provenance][-3:]
    assert reviews == [("approved", "operator"), ("retired", "operator"), ("restored", "operator")], item.provenance
