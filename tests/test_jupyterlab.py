"""JupyterLab as a person uses it: a real JupyterLab server on loopback (with a token), driven in
Debian's headless Chromium through Selenium. It opens notebooks/00_tour.ipynb, runs every cell
from the Run menu in the smoke profile, and checks that every cell ran without an error, that the
figures render as images, that no progress bar is left short of 100 %, and that the explorer of
the last cell redraws its figure when a control changes.

The notebook is a copy in a temporary folder (running it never touches the stored one); runs and
figures go to temporary folders. On a failure a screenshot and the page's HTML are saved to
``$FAIRFL_ARTIFACTS`` (default ``<repo>/tmp/artifacts``). With ``FAIRFL_DOCS_SCREENSHOTS=1`` the
test also writes docs/explore-1.png and docs/explore-2.png (the explorer after two selections).

Chromium comes from the system (scripts/setup.sh installs ``chromium`` and ``chromium-driver``);
nothing is downloaded. Without it the test is skipped, saying so.
"""
from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("FAIRFL_ARTIFACTS", REPO / "tmp" / "artifacts"))
RUN_TIMEOUT = 240            # seconds for every cell of 00 in the smoke profile (about 40 s measured)

pytestmark = pytest.mark.skipif(not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
                                reason="Debian's chromium and chromium-driver are not installed "
                                       "(scripts/setup.sh installs them: apt-get install chromium chromium-driver)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 with a random token, serving a copy of notebook 00; stopped
    (and its kernels with it) at the end, whatever happened."""
    work = tmp_path / "lab"
    work.mkdir()
    shutil.copy(REPO / "notebooks" / "00_tour.ipynb", work / "00_tour.ipynb")
    token, port = secrets.token_hex(16), _free_port()
    env = {**os.environ, "FAIRFL_PROFILE": "smoke", "FAIRFL_RESULTS": str(tmp_path / "results"),
           "FAIRFL_FIGURES": str(tmp_path / "figures"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings")}
    env.pop("TQDM_DISABLE", None)         # the progress bars are part of what a person sees
    log = open(tmp_path / "jupyterlab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--ServerApp.open_browser=False",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         *(["--allow-root"] if os.geteuid() == 0 else [])],             # CI containers run as root
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"JupyterLab did not start: {(tmp_path / 'jupyterlab.log').read_text()[-2000:]}")
            time.sleep(0.3)
        yield url, token
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


@pytest.fixture
def browser():
    """Headless Chromium through chromedriver (both Debian's); quit at the end, whatever happened."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1500,1100",
                "--disable-gpu", "--no-first-run"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver, condition, timeout: float, what: str):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout, poll_frequency=0.5).until(condition, message=f"waited {timeout} s for {what}")


def _prompts(driver) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(e => e.textContent.trim())")


def _click_menu(driver, menu: str, label: str) -> None:
    """Open ``menu`` in the menu bar and click its item ``label``, as a person does."""
    from selenium.webdriver.common.by import By
    item = next(e for e in driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item") if e.text.strip() == menu)
    item.click()

    def entry(d):
        return next((e for e in d.find_elements(By.CSS_SELECTOR, ".lm-Menu-item .lm-Menu-itemLabel")
                     if e.text.strip() == label), None)
    _wait(driver, entry, 10, f"{label!r} in the {menu} menu").click()


def _explorer_image(driver) -> str | None:
    return driver.execute_script(
        "const img = document.querySelector('.fairfl-explorer img'); return img && img.complete && "
        "img.naturalWidth > 0 ? img.src : null")


def _choose(driver, label_text: str, option_text: str) -> None:
    """Pick ``option_text`` in the explorer's dropdown whose options include it (the first such)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    for element in driver.find_elements(By.CSS_SELECTOR, ".fairfl-explorer select"):
        if element.is_displayed() and option_text in [o.text for o in Select(element).options]:
            if label_text in element.find_element(By.XPATH, "..").text:
                Select(element).select_by_visible_text(option_text)
                return
    raise AssertionError(f"no explorer control {label_text!r} offers {option_text!r}")


def test_tour_notebook_runs_in_jupyterlab_with_figures_progress_and_a_live_explorer(lab, browser, request):
    from selenium.webdriver.common.by import By
    url, token = lab
    t0 = time.time()
    try:
        browser.get(f"{url}/lab/tree/00_tour.ipynb?token={token}")
        _wait(browser, lambda d: d.execute_script(
            "return document.querySelectorAll('.jp-NotebookPanel .jp-CodeCell').length") > 0, 60, "the notebook")
        import nbformat
        cells = sum(c.cell_type == "code" for c in nbformat.read(REPO / "notebooks" / "00_tour.ipynb", 4).cells)
        # JupyterLab asks which kernel to start for a notebook it has not run before: take the one it proposes
        accept = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, ".jp-Dialog .jp-mod-accept")
                       or d.execute_script("return document.querySelector('.jp-Notebook-ExecutionIndicator')"
                                           "?.getAttribute('data-status') === 'idle'"), 30, "the kernel dialog")
        if isinstance(accept, list):
            accept[0].click()
        _wait(browser, lambda d: d.execute_script(
            "const s = document.querySelector('.jp-Notebook-ExecutionIndicator'); "
            "return s && s.getAttribute('data-status') === 'idle'"), 60, "an idle kernel")
        _click_menu(browser, "Run", "Run All Cells")
        # every code cell numbered, none waiting or running ([*]): all ran, in order, without stopping
        _wait(browser, lambda d: len(_prompts(d)) == cells and all(p.startswith("[") and p[1:-2].isdigit()
                                                                   for p in _prompts(d)), RUN_TIMEOUT,
              "every cell to run")
        numbers = [int(p[1:-2]) for p in _prompts(browser)]
        assert numbers == sorted(numbers) and len(numbers) == cells, numbers

        errors = browser.execute_script(
            "return [...document.querySelectorAll('.jp-OutputArea-output')].map(e => e.textContent)"
            ".filter(t => /Traceback|Error:/.test(t))")
        assert not errors, f"cells show errors: {[e[:300] for e in errors]}"

        images = browser.execute_script(
            "return [...document.querySelectorAll('.jp-OutputArea-output img')].map(i => [i.naturalWidth, i.naturalHeight])")
        assert len(images) >= 4 and all(w > 100 and h > 100 for w, h in images), images   # 3 figures + the explorer

        bars = browser.execute_script(
            "return [...document.querySelectorAll('.jp-OutputArea-output .widget-hprogress')]"
            ".filter(p => p.offsetParent !== null).map(p => p.parentElement.textContent)")
        assert bars, "no progress bar shown (the sweep of 00 trains two runs)"
        assert all("100%" in b for b in bars), f"progress bars short of 100 %: {bars}"

        _wait(browser, lambda d: _explorer_image(d), 30, "the explorer's figure")
        before = _explorer_image(browser)
        _choose(browser, "metric", "averaged training loss")
        _wait(browser, lambda d: _explorer_image(d) not in (None, before), 30, "the explorer to redraw")
        if os.environ.get("FAIRFL_DOCS_SCREENSHOTS"):
            explorer = browser.find_element(By.CSS_SELECTOR, ".fairfl-explorer")
            browser.execute_script("arguments[0].scrollIntoView()", explorer)
            explorer.screenshot(str(REPO / "docs" / "explore-1.png"))
            second = _explorer_image(browser)
            _choose(browser, "metric", "worst x % of clients (%)")
            _wait(browser, lambda d: _explorer_image(d) not in (None, second), 30, "the second redraw")
            explorer.screenshot(str(REPO / "docs" / "explore-2.png"))
        print(f"00_tour ran in JupyterLab in {time.time() - t0:.1f} s ({cells} code cells, {len(images)} images, "
              f"{len(bars)} progress bar(s))")
    except BaseException:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        stem = ARTIFACTS / request.node.name
        browser.save_screenshot(f"{stem}.png")
        Path(f"{stem}.html").write_text(browser.page_source)
        print(f"screenshot and page saved: {stem}.png, {stem}.html")
        raise
