"""The team page in a real browser: Debian's headless Chromium driven through chromedriver (selenium).

A person's path, in demo mode (the page's user picker): pick the team's lead, open the team page, read the
statement, click through a project to the job with the most idle cost, see its devices minute by minute,
download a table as CSV, and publish a correction through the form. The browser requests nothing but the
app (its performance log lists every URL it fetched). Screenshots of each page land in
`$GPULEDGER_TEST_ARTIFACTS` (default: the test's tmp dir).

Chromium and chromedriver come from Debian's packages; when they are missing and the test runs as root (CI
on Debian 12) the fixture installs them with apt-get, never skips.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fixtures_web import END_MS, PERIOD, SIM, Published, run_cli, small_ledger, web_ledger

from base.settings import BrokerSettings, Settings, WebSettings
from producers.simulator import expected_ledger
from stack.broker import free_ports

pytestmark = pytest.mark.integration
__all__ = ["small_ledger", "web_ledger"]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
LEAD = "vis00"


def ensure_chromium() -> None:
    """Debian's chromium and chromium-driver, installed with apt-get when missing (root only)."""
    if Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists():
        return
    if os.geteuid() != 0:
        pytest.fail("the browser test needs Debian's chromium and chromium-driver: "
                    "apt-get install -y chromium chromium-driver (as root)")  # fmt: skip
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", "chromium", "chromium-driver"], check=True, env=env,
                   timeout=900)  # fmt: skip


@pytest.fixture
def served(web_ledger: Any, tmp_path: Path) -> Iterator[tuple[str, Published]]:
    """The app under uvicorn on a free loopback port, demo mode on, corrections captured."""
    import uvicorn

    from web.app import create_app
    from web.context import build_context

    ch, _ = web_ledger
    settings = Settings(state_dir=tmp_path, cluster="sim", clickhouse=ch, broker=BrokerSettings(enabled=False),
                        web=WebSettings(demo=True))  # fmt: skip
    published = Published()
    ctx = build_context(settings, publisher=published)
    ctx.clock = lambda: END_MS / 1000
    port = free_ports(1)[0]
    server = uvicorn.Server(uvicorn.Config(create_app(ctx), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}", published
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    ensure_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    downloads = tmp_path / "downloads"
    downloads.mkdir()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1360,1000",
                "--disable-background-networking", "--disable-component-update", "--no-first-run"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})  # fmt: skip
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.downloads = downloads
    try:
        yield driver
    finally:
        driver.quit()


def artifacts(tmp_path: Path) -> Path:
    where = Path(os.environ.get("GPULEDGER_TEST_ARTIFACTS") or tmp_path / "artifacts")
    where.mkdir(parents=True, exist_ok=True)
    return where


def requested_urls(driver: Any) -> list[str]:
    import json

    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def wait_for_file(folder: Path, timeout_s: float = 15.0) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done = [p for p in folder.iterdir() if p.suffix == ".csv"]
        if done:
            return done[0]
        time.sleep(0.1)
    raise AssertionError(f"no CSV downloaded into {folder}: {list(folder.iterdir())}")


def test_a_lead_clicks_from_the_team_page_to_a_jobs_device_minutes_and_downloads_csv(
    served: tuple[str, Published], browser: Any, web_ledger: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    base, published = served
    shots = artifacts(tmp_path)
    browser.get(base + "/")
    Select(browser.find_element(By.ID, "demo-user")).select_by_value(LEAD)
    browser.find_element(By.CSS_SELECTOR, ".demo-banner button").click()
    assert browser.find_element(By.ID, "viewer").text == LEAD
    browser.get(f"{base}/?period={PERIOD}")
    browser.find_element(By.ID, "team-vision").click()
    assert "vision" in browser.find_element(By.ID, "team-title").text
    browser.save_screenshot(str(shots / "team-page.png"))

    # The statement on the screen is the report's line.
    ch, _ = web_ledger
    report = {r["line"]: r for r in csv.DictReader(io.StringIO(
        run_cli(ch, "report", "chargeback", "--period", PERIOD, "--format", "csv")))}  # fmt: skip
    charge = browser.find_element(By.CSS_SELECTOR, "#fig-charge .value").get_attribute("data-raw")
    assert charge == report["vision"]["charge"]

    # Download the projects table as a person would.
    browser.find_element(By.ID, "csv-projects").click()
    downloaded = wait_for_file(browser.downloads)
    rows = list(csv.DictReader(io.StringIO(downloaded.read_text())))
    assert sum(float(r["charge"]) for r in rows) == pytest.approx(float(report["vision"]["charge"]))

    # Project -> the job with the most idle cost -> its devices minute by minute.
    job = max((j for j in expected_ledger(SIM).values() if j.team == "vision"), key=lambda j: j.idle_s)
    browser.find_element(By.LINK_TEXT, job.project).click()
    assert job.project in browser.find_element(By.ID, "project-title").text
    browser.save_screenshot(str(shots / "project-page.png"))
    browser.find_element(By.LINK_TEXT, job.job_id).click()
    assert job.job_id in browser.find_element(By.ID, "job-title").text
    classes = {td.text.split(" ")[0] for td in browser.find_elements(By.CSS_SELECTOR, "#table-minutes td.cls")}
    assert "idle" in classes and classes <= {"active", "starved", "idle", "dark"}
    assert browser.find_elements(By.CSS_SELECTOR, "#timeline svg rect.c-idle")
    browser.save_screenshot(str(shots / "job-page.png"))

    # A correction through the form: published as the audited event, the page says so.
    Select(browser.find_element(By.ID, "new-project")).select_by_index(0)
    browser.find_element(By.ID, "reason").send_keys("a benchmark, not this project's work")
    browser.find_element(By.ID, "correction-submit").click()
    assert "published" in browser.find_element(By.ID, "corrected").text
    (_, _, record), = published.records
    assert record["job_id"] == job.job_id and record["corrected_by"] == f"{LEAD} (web demo)"

    # Nothing but the app was asked for anything.
    urls = requested_urls(browser)
    assert any(u.startswith(f"{base}/static/style.css") for u in urls)
    foreign = [u for u in urls if not u.startswith(base) and not u.startswith("data:")]
    assert not foreign, foreign
    assert (shots / "team-page.png").stat().st_size > 10_000


def test_in_the_browser_a_user_appeals_an_operator_credits_and_another_team_is_refused(
    small_ledger: Any, kafka_bootstrap: str, browser: Any, tmp_path: Path
) -> None:
    """With the simulated organisation's policy: the job's user files an appeal from the job page, the operator
    grants a credit on the appeals page, the team page's statement carries it; a member of another team gets
    the 403 page. Between the steps the sinks' consumer stores the appeal's events, as `up` runs it."""
    import uuid

    import uvicorn
    from confluent_kafka.admin import AdminClient, NewTopic
    from fixtures_web import REPO, SMALL
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from base.settings import KafkaSettings, SinksSettings
    from schemas.topics import APPEALS
    from sinks.consumer import LedgerSink
    from sinks.db import connect
    from sinks.writer import LedgerWriter
    from web.app import create_app
    from web.context import build_context

    settings = Settings(
        state_dir=tmp_path, cluster="sim", clickhouse=small_ledger, broker=BrokerSettings(enabled=False),
        policy_path=REPO / "deploy" / "policy.sim.yaml", web=WebSettings(demo=True),
        kafka=KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=f"b{uuid.uuid4().hex[:8]}."),
        sinks=SinksSettings(group_id=f"web-browser-{uuid.uuid4().hex[:8]}"),
    )  # fmt: skip
    topic = settings.kafka.topic(APPEALS.name)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)

    def sink() -> None:
        LedgerSink(settings.kafka, settings.sinks, LedgerWriter(connect(small_ledger)),
                   topics=[APPEALS.name]).run(lambda: False, max_idle_s=5.0)  # fmt: skip

    ctx = build_context(settings)
    ctx.clock = lambda: (SMALL.start_ms + SMALL.duration_s * 1000) / 1000
    port = free_ports(1)[0]
    server = uvicorn.Server(uvicorn.Config(create_app(ctx), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    base, shots = f"http://127.0.0.1:{port}", artifacts(tmp_path)
    try:
        job = max(expected_ledger(SMALL).values(), key=lambda j: j.allocated_s)
        browser.get(f"{base}/demo?user={job.user}")
        browser.get(f"{base}/jobs/sim/{job.job_id}?period={PERIOD}")
        browser.find_element(By.ID, "appeal-reason").send_keys("a benchmark the platform team asked for")
        browser.find_element(By.ID, "appeal-submit").click()
        assert "filed" in browser.find_element(By.ID, "appealed").text
        sink()

        browser.get(f"{base}/demo?user=ops00")
        browser.find_element(By.ID, "nav-appeals").click()
        form = browser.find_element(By.CSS_SELECTOR, "form.decide-form")
        Select(form.find_element(By.NAME, "decision")).select_by_value("credit")
        form.find_element(By.NAME, "amount").send_keys("7.50")
        form.find_element(By.NAME, "note").send_keys("credited: requested benchmark")
        browser.save_screenshot(str(shots / "appeals-page.png"))
        form.find_element(By.TAG_NAME, "button").click()
        assert "decided" in browser.find_element(By.ID, "decided").text
        sink()

        browser.find_element(By.ID, "nav-fleet").click()  # the operator's fleet page: every team, as CSV too
        assert "Fleet" in browser.find_element(By.ID, "fleet-title").text
        assert browser.find_elements(By.CSS_SELECTOR, "#table-teams tbody tr")
        browser.save_screenshot(str(shots / "fleet-page.png"))

        browser.get(f"{base}/teams/{job.team}?period={PERIOD}")
        credit = browser.find_elements(By.CSS_SELECTOR, "#table-pending tbody tr")
        assert len(credit) == 1 and "-$7.50" in credit[0].text and "credit" in credit[0].text
        charge = Decimal(browser.find_element(By.CSS_SELECTOR, "#fig-charge .value").get_attribute("data-raw"))
        total = Decimal(browser.find_element(By.ID, "statement-total").get_attribute("data-raw"))
        assert total == charge - Decimal("7.50")
        browser.save_screenshot(str(shots / "team-page-credit.png"))

        outsider = "nlp01" if job.team != "nlp" else "vis01"
        browser.get(f"{base}/demo?user={outsider}")
        browser.get(f"{base}/teams/{job.team}?period={PERIOD}")
        assert "Not yours to see" in browser.page_source and outsider in browser.find_element(By.ID, "error").text
        browser.save_screenshot(str(shots / "forbidden.png"))
    finally:
        server.should_exit = True
        thread.join(10)
