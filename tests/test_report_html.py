"""The interactive HTML report (issue 15), checked in a real headless Chromium driven by
Selenium: it loads offline with no console errors, sorting works, selecting a Pareto point or a
row shows that plan; the sweep page draws its charts; Jupyter gets HTML."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

import meshplan as mp
from meshplan.cli import main
from meshplan.report_html import pareto_indices

webdriver = pytest.importorskip("selenium.webdriver")  # the test extra installs it
from selenium.webdriver.common.by import By  # noqa: E402

PROBLEM = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "64", "--global-batch", "512",
           "--seq-len", "4096"]


def _chromium() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (browser and driver):
        pytest.fail("the report tests need Debian's chromium and chromium-driver (.ci/run installs them)")
    return browser, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary, driver_path = _chromium()
    options = Options()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--no-first-run", "--disable-extensions", "--host-resolver-rules=MAP * ~NOTFOUND"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _open(driver: Any, path: Path) -> None:
    driver.get(path.as_uri())
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == []


def test_pareto_indices() -> None:
    pts = [(1.0, 5.0), (2.0, 3.0), (3.0, 4.0), (4.0, 1.0), (2.0, 3.5)]
    assert pareto_indices(pts) == [0, 1, 3]


def test_search_report_in_chromium(browser: Any, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "search.html"
    assert main(["report", *PROBLEM, "--top-k", "60", "--html", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    text = out.read_text()
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in text and "<script src" not in text
    _open(browser, out)
    rows = browser.find_elements(By.CSS_SELECTOR, "#plans tbody tr")
    assert len(rows) == 60
    # The first plan is selected at load, with its breakdowns, schedule, mesh and axes.
    assert browser.find_element(By.ID, "selected-plan").get_attribute("data-index") == "0"
    assert browser.find_elements(By.CSS_SELECTOR, "#schedule rect")
    assert browser.find_elements(By.CSS_SELECTOR, "#axes tr")
    # Sorting by peak memory: ascending, then descending.
    header = browser.find_element(By.CSS_SELECTOR, "#plans th[data-key=peak_memory_gib]")
    header.click()
    mem = [float(td.text) for td in browser.find_elements(By.CSS_SELECTOR, "#plans tbody tr td:last-child")]
    assert mem == sorted(mem) and mem[0] < mem[-1]
    header.click()
    mem = [float(td.text) for td in browser.find_elements(By.CSS_SELECTOR, "#plans tbody tr td:last-child")]
    assert mem == sorted(mem, reverse=True)
    # Filtering.
    box = browser.find_element(By.ID, "plans-filter")
    box.send_keys("zero=3")
    shown = browser.find_elements(By.CSS_SELECTOR, "#plans tbody tr")
    assert 0 < len(shown) < 60
    box.clear()
    box.send_keys(" ")  # an input event with an empty query: everything back
    assert len(browser.find_elements(By.CSS_SELECTOR, "#plans tbody tr")) == 60
    # Clicking a point of the Pareto front selects its plan.
    points = browser.find_elements(By.CSS_SELECTOR, "#pareto circle.front")
    assert len(points) >= 1
    target = points[-1]
    index = target.get_attribute("data-index")
    target.click()
    assert browser.find_element(By.ID, "selected-plan").get_attribute("data-index") == index
    plan_text = target.find_element(By.TAG_NAME, "title").get_attribute("textContent")
    assert plan_text in browser.find_element(By.ID, "selected-plan").text
    assert browser.find_element(By.CSS_SELECTOR, f"#plans tr[data-index='{index}']").get_attribute(
        "class") == "sel"
    # Clicking a table row selects that plan too.
    browser.find_element(By.CSS_SELECTOR, "#plans tbody tr[data-index='5']").click()
    assert browser.find_element(By.ID, "selected-plan").get_attribute("data-index") == "5"
    assert browser.find_element(By.CSS_SELECTOR, "#pareto circle[data-index='5']").get_attribute(
        "class").endswith("sel")
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def test_sweep_report_in_chromium(browser: Any, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep.html"
    assert main(["sweep", "--model", "llama3-8b,llama3-70b", "--gpu", "h100-sxm", "--gpus",
                 "64,128", "--global-batch", "512", "--seq-len", "4096", "--max-micro-batch", "2",
                 "--gpu-sweep", "memory_gib=80,141", "--html", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    _open(browser, out)
    assert "HYPOTHETICAL" in browser.find_element(By.ID, "banner").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#plans tbody tr")) == 8
    # One line per (model, memory) series over the GPU counts, in both charts.
    assert len(browser.find_elements(By.CSS_SELECTOR, "#throughput polyline")) == 4
    assert len(browser.find_elements(By.CSS_SELECTOR, "#mfu circle")) == 8
    browser.find_element(By.CSS_SELECTOR, "#plans th[data-key=tokens_per_s_per_gpu]").click()
    tps = [float(td.text.replace(",", "")) for td in browser.find_elements(
        By.CSS_SELECTOR, "#plans tbody tr td:nth-child(8)")]
    assert tps == sorted(tps) and tps[0] < tps[-1]
    browser.find_element(By.CSS_SELECTOR, "#plans tbody tr[data-index='3']").click()
    assert "best plan dp=" in browser.find_element(By.ID, "detail").text


def test_jupyter_html() -> None:
    work = mp.Workload(512, 4096)
    result = mp.search("llama3-8b", mp.Cluster("h100-sxm", 64), work, mp.SearchSpace(top_k=3))
    page = result._repr_html_()
    assert page.count("<tr>") == 4 and str(result.plans[0].plan) in page
    x = mp.explain("llama3-8b", mp.Cluster("h100-sxm", 64), work, result.plans[0].plan)
    page = x._repr_html_()
    assert "bytes/token/GPU" in page and ">dp<" in page
