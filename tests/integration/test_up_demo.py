"""`make up` as a new user tries it: the whole local stack on the simulator, started the way `make up` starts it
(`.venv/bin/gpuledger up` in the project folder, the venv not on PATH), on free ports and a tmp state dir.

- It runs with the simulated organisation's policy (deploy/policy.sim.yaml) though none is configured: the
  appeals service runs, the reservation service is off and says why (no engine), and `up` says which policy.
- Every command `up` prints to try next runs when pasted as printed in the project folder.
- In Debian's headless Chromium: vis00 opens the vision team page and sees its quota and use, files an appeal on a
  job's page, and the appeal is on ops00's appeals page (the sinks component stored it, as for any user).
Screenshots land in `$GPULEDGER_TEST_ARTIFACTS` (default: the test's tmp dir).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_web_browser import artifacts, browser, ensure_chromium

from stack import broker

pytestmark = pytest.mark.integration
__all__ = ["browser", "ensure_chromium"]
REPO = Path(__file__).resolve().parents[2]
ENTRY = Path(sys.executable).parent / "gpuledger"  # this venv's entry point, what `make up` runs


class Demo:
    def __init__(self, up: subprocess.CompletedProcess[str], env: dict[str, str], state: Path) -> None:
        self.up, self.env, self.state = up, env, state

    @property
    def commands(self) -> list[str]:
        """The commands `up` printed to try next, as printed (two spaces in; their notes are six)."""
        after = self.up.stdout.split("Look at:", 1)[1]
        return [line[2:] for line in after.splitlines() if line.startswith("  ") and not line.startswith("   ")]

    @property
    def web(self) -> str:
        found = re.search(r"The team page: (http://\S+)", self.up.stdout)
        assert found, self.up.stdout
        return found.group(1).rstrip("/")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    tmp = tmp_path_factory.mktemp("demo")
    port, controller, ch, registry, web, metrics = broker.free_ports(6)
    venv_bin = str(ENTRY.parent)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPULEDGER_") and k != "VIRTUAL_ENV"},
        # A new user's shell: the venv is not on PATH.
        "PATH": os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != venv_bin),
        "GPULEDGER_BROKER__PORT": str(port),
        "GPULEDGER_BROKER__CONTROLLER_PORT": str(controller),
        "GPULEDGER_REGISTRY__PORT": str(registry),
        "GPULEDGER_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
        "GPULEDGER_CLICKHOUSE__URL": f"http://127.0.0.1:{ch}",
        "GPULEDGER_WEB__PORT": str(web),
        "GPULEDGER_METRICS__BASE_PORT": str(metrics),
        "GPULEDGER_CONFIG": str(tmp / "absent.toml"),
        "COLUMNS": "250",
    }
    state = tmp / "state"
    up = subprocess.run([str(ENTRY.relative_to(REPO)), "up", "--state-dir", str(state), "--wait", "240"], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
        yield Demo(up, env, state)
    finally:
        subprocess.run([str(ENTRY), "down", "--state-dir", str(state)], env=env, capture_output=True, timeout=180)


def test_up_runs_the_simulator_with_the_simulated_organisations_policy(demo: Demo) -> None:
    import json

    assert "policy: deploy/policy.sim.yaml (the simulated organisation's" in demo.up.stdout
    assert "reservations: recorded, approved and charged; no engine configured" in demo.up.stdout
    st = json.loads(subprocess.run([str(ENTRY), "status", "--json", "--state-dir", str(demo.state)], env=demo.env,
                                   capture_output=True, text=True, timeout=120).stdout)  # fmt: skip
    comps = {c["name"]: c for c in st["components"]}
    assert comps["appeals"]["state"] == "running", comps["appeals"]
    assert comps["reservations"]["state"] == "disabled" and "no engine" in comps["reservations"]["detail"]
    assert all(c["healthy"] for c in comps.values()), [c for c in comps.values() if not c["healthy"]]


def test_every_command_up_prints_runs_as_printed(demo: Demo) -> None:
    commands = demo.commands
    assert len(commands) >= 8 and commands[-1].endswith(f"down --state-dir {demo.state}")
    for command in commands[:-1]:  # `down` last, by the fixture's teardown below
        assert command.startswith((".venv/bin/gpuledger ", "tail -f ")), command
        if command.startswith("tail -f "):  # follows forever: it runs while the file is there
            with pytest.raises(subprocess.TimeoutExpired):
                subprocess.run(["bash", "-c", command], cwd=REPO, env=demo.env, capture_output=True, timeout=3)
            continue
        done = subprocess.run(["bash", "-c", command], cwd=REPO, env=demo.env, capture_output=True, text=True,
                              timeout=180)  # fmt: skip
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        assert done.stdout.strip(), command
        if "--quota" in command:
            assert "quota_gpu_h" in done.stdout or "quota" in done.stdout.lower(), done.stdout
        elif "report chargeback" in command:
            assert "TOTAL" in done.stdout and ("vision" in done.stdout), done.stdout


def test_a_lead_sees_quota_and_appeals_and_the_operator_sees_it(demo: Demo, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    base, shots = demo.web, artifacts(tmp_path)
    browser.get(f"{base}/demo?user=vis00")
    browser.get(f"{base}/teams/vision")
    quota = browser.find_element(By.ID, "quota")
    items = quota.find_elements(By.CSS_SELECTOR, ".quota-list li")
    assert "No policy.yaml configured" not in quota.text and items, quota.text
    # Each generation of the policy's quota, its use beside it (deploy/policy.sim.yaml: hopper 4 GPUs, ...).
    assert {li.text.split(":")[0] for li in items} >= {"hopper", "ampere"}
    assert all(re.search(r"[\d.]+ of [\d.,]+ GPU-h", li.text) for li in items), [li.text for li in items]
    browser.save_screenshot(str(shots / "demo-team-quota.png"))

    link = browser.find_element(By.CSS_SELECTOR, "#table-idle_jobs a[href^='/jobs/']")
    job_path = link.get_attribute("href").split("?")[0]
    link.click()
    browser.find_element(By.ID, "appeal-reason").send_keys("a benchmark the platform team asked for")
    browser.find_element(By.ID, "appeal-submit").click()
    filed = browser.find_element(By.ID, "appealed").text
    appeal_id = re.search(r"Appeal (\S+) filed", filed).group(1)  # type: ignore[union-attr]
    browser.save_screenshot(str(shots / "demo-appeal-filed.png"))

    browser.get(f"{base}/demo?user=ops00")
    deadline = time.monotonic() + 120
    while True:  # the sinks component stores the appeal's event; the page shows it once stored
        browser.get(f"{base}/appeals")
        if appeal_id in browser.find_element(By.TAG_NAME, "main").text or time.monotonic() > deadline:
            break
        time.sleep(2)
    main = browser.find_element(By.TAG_NAME, "main").text
    assert appeal_id in main and job_path.split("/jobs/", 1)[1].split("/", 1)[1] in main, main[:2000]
    assert browser.find_elements(By.CSS_SELECTOR, "form.decide-form")  # ops00 decides it
    browser.save_screenshot(str(shots / "demo-appeals-ops00.png"))
