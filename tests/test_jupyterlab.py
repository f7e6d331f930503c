"""JupyterLab as a person uses it: a real JupyterLab server on loopback (with a token), driven in
Debian's headless Chromium through Selenium. It opens notebooks/00_tour.ipynb and checks that
opening it does not modify it (no dirty mark while autosave runs every second; File ▸ Save writes
the stored bytes back), runs every cell from the Run menu in the smoke profile, and checks that
every cell ran without an error, that the figures render as images, that no progress bar is left
short of 100 %, and that the explorer of the last cell redraws its figure when a control changes
and fits the notebook's column (no horizontal scrollbar, nothing cut off at the right), as does
``fairfl.explore()`` over the whole cache, typed in a cell below.
Then, in a cell typed below, a sweep on the process pool is stopped with Kernel ▸ Interrupt: the
cell shows the one "interrupted: …" line and no traceback, and no worker process is left.

The notebook is a copy in a temporary folder (running it never touches the stored one); runs and
figures go to temporary folders. On a failure a screenshot and the page's HTML are saved to
``$FAIRFL_ARTIFACTS`` (default ``<repo>/tmp/artifacts``). With ``FAIRFL_DOCS_SCREENSHOTS=CACHE``
(a results folder; ``scripts/explore_screenshots.py`` fills one and runs this test) the test also
opens ``fairfl.explore(root=CACHE)`` and writes docs/explore-1.png and docs/explore-2.png (that
explorer after two selections).

Chromium comes from the system (scripts/setup.sh installs ``chromium`` and ``chromium-driver``);
nothing is downloaded. Without it the test is skipped, saying so.
"""
from __future__ import annotations

import json
import os
import platform
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from processes import children, stop_group

REPO = Path(__file__).resolve().parent.parent
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ARTIFACTS = Path(os.environ.get("FAIRFL_ARTIFACTS", REPO / "tmp" / "artifacts"))


def save_artifacts(browser, request) -> None:
    """A failed browser test leaves its screenshot and page under ARTIFACTS, named after the test."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    stem = ARTIFACTS / request.node.name
    browser.save_screenshot(f"{stem}.png")
    Path(f"{stem}.html").write_text(browser.page_source)
    print(f"screenshot and page saved: {stem}.png, {stem}.html")
DISTRIBUTION = "per-client accuracy distribution"   # a metric of fairfl.studies.explorer

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
    # The stored notebook, with language_info.version set to this Python's (JupyterLab writes the
    # kernel's, so on the Python patch version it was stored with this is the stored file, byte for byte)
    from fairfl.studies.notebook import stored_form
    stored = (REPO / "notebooks" / "00_tour.ipynb").read_text(encoding="utf-8")
    (work / "00_tour.ipynb").write_text(stored_form(stored, python_version=platform.python_version()), encoding="utf-8")
    # autosave every second instead of every two minutes: a notebook modified on opening is then
    # written within the test's wait
    settings = tmp_path / "settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"autosaveInterval": 1}))
    # and no "official Jupyter news?" notification over the page (and the screenshots)
    notification = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True)
    (notification / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    token, port = secrets.token_hex(16), _free_port()
    # What earlier tests of this worker may have left in its environment (an in-process `reproduce`
    # sets FAIRFL_*; a kernel started in-process sets MPLBACKEND) never reaches the lab's kernels:
    # the lab sees the machine's environment and the settings below, as a person's would
    session_wide = {"FAIRFL_DATA", "FAIRFL_OFFLINE", "FAIRFL_TEST_DATA"}        # conftest's, for every test
    leftovers = {k: v for k, v in os.environ.items()
                 if k.startswith(("FAIRFL_", "MPL", "JPY_", "JUPYTER", "IPY")) and k not in session_wide}
    if leftovers:
        print(f"left out of the lab's environment: {leftovers}")
    env = {**{k: v for k, v in os.environ.items() if k not in leftovers}, "FAIRFL_PROFILE": "smoke", "FAIRFL_RESULTS": str(tmp_path / "results"),
           "FAIRFL_FIGURES": str(tmp_path / "figures"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"), "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings")}
    env.pop("TQDM_DISABLE", None)         # the progress bars are part of what a person sees,
    env.pop("FAIRFL_PROGRESS", None)      # as widgets (what `reproduce` asks of its kernels is text)
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
        yield url, token, server.pid
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


# Run All is waited for by its progress, not by a deadline: it fails when no cell finishes and no
# output changes for this long (a stall), however long the whole takes on a busy machine
STALL_SECONDS = float(os.environ.get("FAIRFL_TEST_STALL_SECONDS", 600))


def _cells_state(driver) -> list[dict]:
    """Every code cell of the notebook in view: its prompt ("[*]:" running, "[ ]:" waiting, "[n]:"
    done), the first line of its source, and its outputs' text."""
    return driver.execute_script(
        "return [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell')].map(c => ({"
        "prompt: (c.querySelector('.jp-InputArea-prompt') || {}).textContent?.trim() || '', "
        "source: ((c.querySelector('.jp-InputArea-editor .cm-content') || {}).innerText || '').split('\\n')[0], "
        "outputs: [...c.querySelectorAll('.jp-OutputArea-output')].map(e => e.textContent)}))")


def _done(prompt: str) -> bool:
    return prompt.startswith("[") and prompt[1:-2].isdigit()


def _stall_report(cells: list[dict], what: str, stalled: float, total: float) -> str:
    """What a person would look at when Run All does not finish: the cell that runs (or the first
    not run), its source's first line and last output, any cell that shows an error, and how busy
    the machine is."""
    busy = next((i for i, c in enumerate(cells) if c["prompt"] == "[*]:"), None)
    first = busy if busy is not None else next((i for i, c in enumerate(cells) if not _done(c["prompt"])), None)
    lines = [f"{what}: no cell finished and no output changed for {stalled:.0f} s ({total:.0f} s in all); "
             f"{sum(_done(c['prompt']) for c in cells)} of {len(cells)} code cells done; "
             f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"]
    if first is not None:
        c = cells[first]
        state = "running" if first == busy else "not started (the kernel is idle or dead)"
        tail = (c["outputs"][-1] if c["outputs"] else "(no output)")[-800:]
        lines += [f"code cell {first + 1} ({state}): {c['source']!r}", f"its last output: {tail}"]
    errors = [(i + 1, o[:400]) for i, c in enumerate(cells) for o in c["outputs"]
              if re.search(r"Traceback|Error:|Exception", o)]
    if errors:
        lines.append(f"cells with errors: {errors}")
    return "\n".join(lines)


def _wait_for_every_cell(driver, cells: int, what: str, stall: float = STALL_SECONDS) -> list[dict]:
    """Wait until every one of ``cells`` code cells has run, failing with :func:`_stall_report`
    only when nothing has moved for ``stall`` seconds."""
    t0 = last_change = time.monotonic()
    seen = None
    while True:
        state = _cells_state(driver)
        if len(state) == cells and all(_done(c["prompt"]) for c in state):
            return state
        snapshot = json.dumps(state)
        now = time.monotonic()
        if snapshot != seen:
            seen, last_change = snapshot, now
        elif now - last_change > stall:
            raise AssertionError(_stall_report(state, what, now - last_change, now - t0))
        time.sleep(1)


def _prompts(driver) -> list[str]:
    return driver.execute_script(
        "return [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(e => e.textContent.trim())")


def _setting(path: Path) -> dict:
    """A JupyterLab settings file (JSON with // comments) as it stands; {} while JupyterLab is
    writing it (read half-written, it is not JSON yet)."""
    try:
        return json.loads(re.sub(r"//.*", "", path.read_text()))
    except (OSError, json.JSONDecodeError):
        return {}


def _shown_images(driver, at_least: int) -> list | None:
    """The images in the notebook's outputs, [width, height] each, once at least ``at_least`` are
    there and loaded: each cell scrolled into view first (JupyterLab attaches or paints the outputs of
    cells out of view lazily, and a figure's display message can follow its cell's prompt), else None."""
    images = driver.execute_script(
        "const cells = [...document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell')];"
        "cells.forEach(c => c.scrollIntoView({block: 'nearest'}));"
        "return [...document.querySelectorAll('.jp-OutputArea-output img')]"
        ".map(i => [i.naturalWidth, i.naturalHeight])")
    ok = len(images) >= at_least and all(w > 100 and h > 100 for w, h in images)
    return images if ok else None


def _click_menu(driver, menu: str, label: str) -> None:
    """Open ``menu`` in the menu bar and click its item ``label``, as a person does."""
    from selenium.webdriver.common.by import By
    item = next(e for e in driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item") if e.text.strip() == menu)
    item.click()

    def entry(d):
        return next((e for e in d.find_elements(By.CSS_SELECTOR, ".lm-Menu-item .lm-Menu-itemLabel")
                     if e.text.strip() == label), None)
    _wait(driver, entry, 10, f"{label!r} in the {menu} menu").click()


def _explorer_image(driver, explorer: int = 0) -> str | None:
    return driver.execute_script(
        "const box = document.querySelectorAll('.fairfl-explorer')[arguments[0]]; "
        "const img = box && box.querySelector('img'); return img && img.complete && "
        "img.naturalWidth > 0 ? img.src : null", explorer)


def _choose(driver, label_text: str, option_text: str, explorer: int = 0, nth: int = 0) -> bool:
    """Pick ``option_text`` in the ``nth`` dropdown labelled ``label_text`` that offers it, in the
    ``explorer``-th explorer of the page (selection A's controls come before B's). False when it
    was already chosen (nothing changes then)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select
    box = driver.find_elements(By.CSS_SELECTOR, ".fairfl-explorer")[explorer]
    found = [e for e in box.find_elements(By.CSS_SELECTOR, "select")
             if e.is_displayed() and option_text in [o.text for o in Select(e).options]
             and label_text in e.find_element(By.XPATH, "..").text]
    if len(found) <= nth:
        raise AssertionError(f"no explorer control {label_text!r} offers {option_text!r} (number {nth})")
    if Select(found[nth]).first_selected_option.text == option_text:
        return False
    Select(found[nth]).select_by_visible_text(option_text)
    return True


def _explorer_fit(driver, explorer: int = 0) -> dict:
    """How the ``explorer``-th explorer of the page sits in its cell's output: the widths of the
    explorer's content, of the output area (its visible width and its content's, which is wider
    when it scrolls sideways), and the shown elements of the explorer reaching past the output's
    right edge (cut off, or behind a horizontal scrollbar)."""
    return driver.execute_script(
        "const box = document.querySelectorAll('.fairfl-explorer')[arguments[0]]; "
        "const out = box.closest('.jp-OutputArea-output'); const right = out.getBoundingClientRect().right; "
        "const past = [...box.querySelectorAll('*')].filter(e => e.offsetParent !== null "
        "  && e.getBoundingClientRect().width > 0 && e.getBoundingClientRect().right > right + 1)"
        "  .map(e => (e.className || e.tagName) + ' ' + (e.textContent || '').trim().slice(0, 40)); "
        "return {explorer: box.scrollWidth, output: out.clientWidth, output_content: out.scrollWidth, "
        "        past_the_edge: past.slice(0, 8)}", explorer)


def _assert_fits(driver, explorer: int) -> None:
    """No horizontal scrollbar and nothing cut off: the explorer's content is no wider than its
    cell's output at the page's width."""
    fit = _explorer_fit(driver, explorer)
    print(f"explorer {explorer} in its cell's output: {fit}")
    assert fit["explorer"] <= fit["output"] and fit["output_content"] <= fit["output"] \
        and not fit["past_the_edge"], f"the explorer is wider than the notebook's column: {fit}"


def _run_cell_below(driver, code: str) -> None:
    """As a person does: select the last cell, insert a cell below it (B), type ``code`` (one
    statement a line: the editor indents nothing) and run it in place (Ctrl+Enter)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    cells = driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Notebook .jp-Cell")
    driver.execute_script("arguments[0].scrollIntoView()", cells[-1])
    cells[-1].find_element(By.CSS_SELECTOR, ".jp-InputPrompt").click()
    ActionChains(driver).send_keys(Keys.ESCAPE).send_keys("b").perform()
    _wait(driver, lambda d: len(d.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel .jp-Notebook .jp-Cell"))
          == len(cells) + 1, 10, "the new cell")
    ActionChains(driver).send_keys(Keys.ENTER).perform()
    _wait(driver, lambda d: d.execute_script(
        "const c = [...document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell')].at(-1); "
        "return c.contains(document.activeElement) && document.activeElement.closest('.cm-editor') !== null"),
          10, "the new cell's editor")
    ActionChains(driver).send_keys(code).perform()
    ActionChains(driver).key_down(Keys.CONTROL).send_keys(Keys.ENTER).key_up(Keys.CONTROL).perform()




def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


# Typed below the last cell of 00 (its BASE: the CNN on 100 label-shard clients): two runs long
# enough to be interrupted, one per worker process, checkpointing every round.
SWEEP_CELL = ("from fairfl.runs.sweeps import ProcessBackend, run_many\n"
              "long = BASE.replace(rounds=500, eval_every=500, checkpoint_every=1)\n"
              "run_many([long.replace(seed=s) for s in (7, 8)], backend=ProcessBackend(workers=2), max_group=1)")
INTERRUPTED = "interrupted: 0 of 2 runs cached, 2 running stopped at their checkpoints; re-run to resume"


def test_tour_notebook_runs_in_jupyterlab_with_figures_progress_a_live_explorer_and_an_interrupt(
        lab, browser, tmp_path, request):
    from selenium.webdriver.common.by import By
    url, token, server = lab
    notebook = tmp_path / "lab" / "00_tour.ipynb"
    opened = notebook.read_bytes()
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

        # Opening does not modify the notebook: the kernel has told JupyterLab its language_info (which
        # JupyterLab writes into the metadata when it differs), autosave runs every second, and after
        # a few seconds nothing is marked modified and the file is as stored; a save writes the same bytes.
        time.sleep(3)
        dirty = browser.execute_script("return [...document.querySelectorAll('.jp-mod-dirty')].map(e => e.textContent)")
        assert not dirty, f"opening the notebook modified it: {dirty}"
        assert notebook.read_bytes() == opened, "autosave rewrote the notebook just opened"
        mtime = notebook.stat().st_mtime_ns
        _click_menu(browser, "File", "Save Notebook")
        _wait(browser, lambda d: notebook.stat().st_mtime_ns != mtime, 20, "the save")
        _wait(browser, lambda d: notebook.read_bytes() == opened, 5,
              "the saved notebook to equal the stored one (it differs: the stored form is not JupyterLab's)")
        # Autosave (every second, for the check above) off for the rest, from the Settings menu: on
        # a loaded machine a save can start before the previous one has returned, and JupyterLab then
        # covers the page with "File Changed … Overwrite?" (seen at a load average of 10 on 2 cores)
        _click_menu(browser, "Settings", "Autosave Documents")
        _wait(browser, lambda d: _setting(tmp_path / "settings" / "@jupyterlab" / "docmanager-extension" /
              "plugin.jupyterlab-settings").get("autosave") is False, 10, "autosave to be off")

        _settled_kernel(url, token, "00_tour.ipynb")          # see _open_and_run_all
        _click_menu(browser, "Run", "Run All Cells")
        # every code cell numbered, none waiting or running ([*]): all ran, in order, without stopping
        _wait_for_every_cell(browser, cells, "Run All of 00_tour.ipynb")
        numbers = [int(p[1:-2]) for p in _prompts(browser)]
        assert numbers == sorted(numbers) and len(numbers) == cells, numbers

        errors = browser.execute_script(
            "return [...document.querySelectorAll('.jp-OutputArea-output')].map(e => e.textContent)"
            ".filter(t => /Traceback|Error:/.test(t))")
        assert not errors, f"cells show errors: {[e[:300] for e in errors]}"

        from selenium.common.exceptions import TimeoutException
        try:
            images = _wait(browser, lambda d: _shown_images(d, at_least=4), 60,
                           "3 figures and the explorer shown")                  # see _shown_images
        except TimeoutException:
            outputs = browser.execute_script(
                "return [...document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell')].map(c => "
                "[...c.querySelectorAll('.jp-OutputArea-output')].map(o => (o.querySelector('img') ? "
                "'img ' : '') + o.textContent.trim().slice(0, 60)))")
            raise AssertionError(f"fewer than 4 images shown; each cell's outputs: {outputs}") from None

        bars = browser.execute_script(
            "return [...document.querySelectorAll('.jp-OutputArea-output .widget-hprogress')]"
            ".filter(p => p.offsetParent !== null).map(p => p.parentElement.textContent)")
        assert bars, "no progress bar shown (the sweep of 00 trains two runs)"
        assert all("100%" in b for b in bars), f"progress bars short of 100 %: {bars}"

        _wait(browser, lambda d: _explorer_image(d), 30, "the explorer's figure")
        before = _explorer_image(browser)
        _choose(browser, "metric", "averaged training loss")
        _wait(browser, lambda d: _explorer_image(d) not in (None, before), 30, "the explorer to redraw")
        # Both explorers fit the notebook's column at JupyterLab's default layout (file browser
        # open): this sweep's, and the whole cache's (more factors, longer names), typed below
        _assert_fits(browser, 0)
        _run_cell_below(browser, "import fairfl\nfairfl.explore()")
        _wait(browser, lambda d: _explorer_image(d, 1), 60, "the cache explorer's figure")
        _assert_fits(browser, 1)
        if os.environ.get("FAIRFL_DOCS_SCREENSHOTS"):
            _docs_screenshots(browser, Path(os.environ["FAIRFL_DOCS_SCREENSHOTS"]))

        # Kernel ▸ Interrupt during a sweep on the process pool: one line, no traceback, no worker left
        kernel = next(p for p in children(server) if "ipykernel" in _cmdline(p))
        results = tmp_path / "results"
        earlier, shown_cells = set(results.glob("*/checkpoint.pt")), len(_prompts(browser))
        _run_cell_below(browser, SWEEP_CELL)
        _wait(browser, lambda d: len(set(results.glob("*/checkpoint.pt")) - earlier) == 2, 120,
              "both runs of the sweep to checkpoint a round")
        workers = [p for p in children(kernel) if "spawn_main" in _cmdline(p)]
        assert len(workers) == 2, [_cmdline(p) for p in children(kernel)]
        _click_menu(browser, "Kernel", "Interrupt Kernel")
        _wait(browser, lambda d: len(_prompts(d)) == shown_cells + 1 and _prompts(d)[-1][1:-2].isdigit(), 60,
              "the interrupted cell to end")
        shown = browser.execute_script(
            "const c = [...document.querySelectorAll('.jp-NotebookPanel .jp-Notebook .jp-Cell')].at(-1); "
            "return [...c.querySelectorAll('.jp-OutputArea-output')].map(e => e.textContent.trim())")
        assert INTERRUPTED in shown, shown
        assert not [t for t in shown if re.search(r"Traceback|KeyboardInterrupt|Error", t)], shown
        deadline = time.time() + 10
        while any(p in children(kernel) for p in workers) and time.time() < deadline:
            time.sleep(0.2)
        assert not [p for p in workers if p in children(kernel)], "a worker outlived the interrupted sweep"
        print(f"00_tour ran in JupyterLab, and a sweep was interrupted, in {time.time() - t0:.1f} s "
              f"({cells} code cells, {len(images)} images, {len(bars)} progress bar(s))")
    except BaseException:
        save_artifacts(browser, request)
        raise


def _docs_screenshots(browser, cache: Path) -> None:
    """The README's screenshots: ``fairfl.explore(root=cache)`` opened in a cell typed below, after two
    selections (A: FedMGDA+ against B: FedAvg, mean accuracy; then A: q-FFL against B: DQN-Fed, the
    per-client accuracy distribution)."""
    from selenium.webdriver.common.by import By
    if not (cache.is_dir() and any(cache.iterdir())):
        raise AssertionError(f"FAIRFL_DOCS_SCREENSHOTS={cache}: not a results folder with runs "
                             "(scripts/explore_screenshots.py fills one)")
    n = len(browser.find_elements(By.CSS_SELECTOR, ".fairfl-explorer"))       # the new one's index
    _run_cell_below(browser, f"import fairfl\nfairfl.explore(root={str(cache)!r})")
    _wait(browser, lambda d: _explorer_image(d, n), 60, "the cache explorer's figure")
    explorer = browser.find_elements(By.CSS_SELECTOR, ".fairfl-explorer")[n]
    for which, (algorithm, metric) in enumerate([(("fedmgda_plus", "fedavg"), "mean accuracy (%)"),
                                                 (("qfedavg", "dqnfed"), DISTRIBUTION)], start=1):
        for nth, name in enumerate(algorithm):
            before = _explorer_image(browser, n)
            if _choose(browser, "algorithm", name, explorer=n, nth=nth):
                _wait(browser, lambda d: _explorer_image(d, n) not in (None, before), 30, "the redraw")
        before = _explorer_image(browser, n)
        if _choose(browser, "metric", metric, explorer=n):
            _wait(browser, lambda d: _explorer_image(d, n) not in (None, before), 30, "the redraw")
        browser.execute_script("arguments[0].scrollIntoView()", explorer)
        explorer.screenshot(str(REPO / "docs" / f"explore-{which}.png"))


# ----------------------------------------------------------------------------- a newcomer's first afternoon

# Typed into cells of notebook 06 after its Run All, as a person prototyping a rule does: a coordinate-wise
# median, registered in the notebook's own process, swept with two seeds on 06's data. One statement a line, and
# the class's body on its line: the editor indents the line after a `class ...:` line.
NEW_ALGORITHM = ("from dataclasses import dataclass\n"
                 "from fairfl.federated.algorithms import Algorithm, register\n"
                 "from fairfl.federated.messages import Aggregate\n"
                 "@register\n"
                 "@dataclass(frozen=True)\n"
                 "class CoordinateMedian(Algorithm): name = 'coordinate_median'; aggregate = lambda self, reports, "
                 "state, ctx: Aggregate(reports.updates.median(dim=0).values, state, {})")
SWEEP_IT = ("from fairfl import ExperimentConfig, LocalTraining, PartitionSpec\n"
            "from fairfl.runs.sweeps import run_many\n"
            "mine = ExperimentConfig(dataset='adult', model='logreg', algorithm=CoordinateMedian(), rounds=3, "
            "partition=PartitionSpec('iid', num_clients=6), local=LocalTraining(batch_size=500), clients_per_round=4)\n"
            "histories = run_many([mine.replace(seed=s) for s in (0, 1)])\n"
            "print('swept', [h.rounds_done for h in histories])")


def _git(clone: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=clone, capture_output=True, text=True, check=True).stdout


def _cell_outputs(driver, last: int | None = None) -> list[str]:
    script = ("const cells = [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook "
              ".jp-Cell')]; const shown = arguments[0] === null ? cells : cells.slice(-arguments[0]); "
              "return shown.flatMap(c => [...c.querySelectorAll('.jp-OutputArea-output')].map(e => e.textContent))")
    return driver.execute_script(script, last)


def _open_and_run_all(browser, url: str, token: str, path: str) -> int:
    """Open ``path`` in JupyterLab, take the kernel it proposes, Run All, wait for every code cell to
    have run (:func:`_wait_for_every_cell`: a stall fails, naming the cell); the number of code cells."""
    import nbformat
    from selenium.webdriver.common.by import By
    browser.get(f"{url}/lab/tree/{path}?token={token}")
    _wait(browser, lambda d: d.execute_script(
        "return document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell').length") > 0,
          90, f"{path} to open")

    dialogs = []

    def kernel_ready(d) -> bool:
        # the preferred kernel starts by itself (autoStartDefaultKernel); should JupyterLab ask, take its proposal
        for dialog in d.find_elements(By.CSS_SELECTOR, ".jp-Dialog"):
            dialogs.append(dialog.text.replace("\n", " | ")[:200])
            print(f"{time.strftime('%H:%M:%S')} dialog while opening {path}: {dialogs[-1]}", flush=True)
            dialog.find_element(By.CSS_SELECTOR, ".jp-mod-accept").click()
            return False
        return d.execute_script(
            "const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)'); "
            "const s = panel && panel.querySelector('.jp-Notebook-ExecutionIndicator'); "
            "const name = panel && panel.querySelector('.jp-KernelName'); "
            "return !!s && s.getAttribute('data-status') === 'idle' && !!name && name.textContent.includes('Python')")
    _wait(browser, kernel_ready, 120, f"{path}'s kernel")
    # JupyterLab can replace the kernel it started for a notebook half a second later (the server's log:
    # "Kernel started: A", "Kernel shutdown: A", "Kernel started: B"); a Run All sent to A in between is
    # dropped and every cell stays "[ ]" (a full suite's timing met this once per run, on two machines).
    # So Run All waits until the server's one session of this notebook keeps one kernel, idle, for 3 s.
    kernel = _settled_kernel(url, token, path)
    cells = sum(c.cell_type == "code" for c in nbformat.read(REPO / path, 4).cells)
    _click_menu(browser, "Run", "Run All Cells")
    _wait_for_every_cell(browser, cells, f"Run All of {path} (kernel {kernel}; dialogs accepted: {dialogs})")
    return cells


def _sessions(url: str, token: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/sessions?token={token}", timeout=30) as r:
        return json.loads(r.read())


def _settled_kernel(url: str, token: str, path: str, settle: float = 3.0, patience: float = 300) -> str:
    """The id of the kernel of ``path``'s session once the server has had exactly one session for it,
    with the same kernel, idle, for ``settle`` seconds; fails after ``patience`` seconds of changes."""
    t0 = time.monotonic()
    seen, since = None, time.monotonic()
    while time.monotonic() - t0 < patience:
        mine = [s for s in _sessions(url, token) if s.get("path", "").endswith(path)]
        now = (tuple(s["kernel"]["id"] for s in mine), tuple(s["kernel"].get("execution_state") for s in mine))
        if now != seen:
            seen, since = now, time.monotonic()
        elif len(now[0]) == 1 and now[1] == ("idle",) and time.monotonic() - since >= settle:
            return now[0][0]
        time.sleep(0.5)
    raise AssertionError(f"the server's sessions of {path} kept changing for {patience:.0f} s: {seen}")


def _no_traceback(texts: list[str], where: str) -> None:
    bad = [t[:400] for t in texts if re.search(r"Traceback|Error:|Exception", t)]
    assert not bad, f"{where} shows errors: {bad}"


@pytest.mark.slow
def test_a_newcomers_first_afternoon_in_a_fresh_clone(browser, tmp_path, request):
    """The README's path from a fresh clone (tests/clone.py): `bash scripts/setup.sh`, `fairfl
    reproduce 00 --profile smoke`, `FAIRFL_PROFILE=smoke make lab ARGS=...` (the server `make lab`
    starts, its file browser at the repository root), Run All and File ▸ Save on 00 and 06, an
    algorithm written in two cells of 06 and swept with two seeds in the kernel (saying so in one
    line), and one exploration from the terminal (`-p rounds=3`). No traceback anywhere (terminal,
    cells), every notebook's first output its header line, the reproduced figures unchanged by the
    exploration, and at the end no tracked file changed: `git status` and `git diff` empty.
    `make lab`'s arguments reach the server, whose file browser is the repository root and opens in
    notebooks/ (before, ARGS were ignored and it served notebooks/ only). The notebooks saved with
    their outputs pass the stored-notebook tests of `make test`; `normalise_notebooks.py --help`
    rewrites nothing, and without the clean filter `--check` names both notebooks and a rewrite
    restores the committed file (before: no filter, ` M notebooks/00_tour.ipynb`, the stored-notebook
    tests failed, and --help stripped every notebook)."""
    import hashlib

    from clone import environment, fresh_clone
    from selenium.webdriver.common.by import By
    clone = fresh_clone(tmp_path / "clone")
    settings = tmp_path / "settings" / "@jupyterlab"
    (settings / "docmanager-extension").mkdir(parents=True)
    # autosave off: what is typed after the last File ▸ Save stays in the browser, as a person who does not save it
    (settings / "docmanager-extension" / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    (settings / "apputils-extension").mkdir(parents=True)
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    (settings / "notebook-extension").mkdir(parents=True)
    (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text(json.dumps({"autoStartDefaultKernel": True}))
    env = environment(clone, OMP_NUM_THREADS="1", JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
                      JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "ws"),
                      JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"))
    for quiet in ("TQDM_DISABLE", "FAIRFL_PROGRESS", "FAIRFL_PROFILE", "FAIRFL_RESULTS", "FAIRFL_FIGURES"):
        env.pop(quiet, None)                  # the repository's own folders, as a newcomer has them

    def shell(*command: str, timeout: float = 600) -> str:
        r = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, f"{' '.join(command)}: {r.stdout[-3000:]}{r.stderr[-3000:]}"
        _no_traceback([r.stdout, r.stderr], " ".join(command))
        return r.stdout

    shell("bash", "scripts/setup.sh")
    said = shell("fairfl", "reproduce", "00", "--profile", "smoke")
    assert "ok      00_tour.ipynb" in said and "00_tour: profile smoke, expected about" in said, said
    smoke = clone / "figures" / "smoke"

    token, port = secrets.token_hex(16), _free_port()
    log = open(tmp_path / "make-lab.log", "w")
    server = subprocess.Popen(
        ["make", "lab", f"ARGS=--no-browser --ip=127.0.0.1 --port={port} --IdentityProvider.token={token} "
         "--LabApp.news_url= --LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        cwd=clone, env={**env, "FAIRFL_PROFILE": "smoke"}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(browser, lambda d: _up(url, token) or server.poll() is not None, 240, "make lab's JupyterLab")
        assert server.poll() is None, (tmp_path / "make-lab.log").read_text()[-3000:]
        _serves_the_repository_root(url, token)
        for path in ("notebooks/00_tour.ipynb", "notebooks/06_one_protocol.ipynb"):
            _open_and_run_all(browser, url, token, path)
            outputs = _cell_outputs(browser)
            _no_traceback(outputs, path)
            header = f"{Path(path).stem}: profile smoke (from $FAIRFL_PROFILE), expected about "
            assert outputs and outputs[0].startswith(header), outputs[:1]
            mtime = (clone / path).stat().st_mtime_ns
            _click_menu(browser, "File", "Save Notebook")
            _wait(browser, lambda d: (clone / path).stat().st_mtime_ns != mtime, 30, f"{path} to be saved")
            # saved with its outputs, which git does not see (the clean filter; make lab's save hook)
            assert '"output_type"' in (clone / path).read_text()
        browser.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell")
        _run_cell_below(browser, NEW_ALGORITHM)
        _run_cell_below(browser, SWEEP_IT)
        _wait(browser, lambda d: any("swept [3, 3]" in t for t in _cell_outputs(d, 1)), 300, "the sweep of two seeds")
        swept = _cell_outputs(browser, 2)
        _no_traceback(swept, "the cells typed into 06")
        assert any("coordinate_median: defined in this notebook or script (__main__)" in t for t in swept), swept
    except BaseException:
        save_artifacts(browser, request)
        raise
    finally:
        stop_group(server)
        log.close()
    lab_log = (tmp_path / "make-lab.log").read_text()
    assert "Traceback" not in lab_log, lab_log[-3000:]

    reproduced = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in smoke.iterdir()}     # 00's and 06's
    assert {"00_tour_curves.png", "06_one_protocol_effects.png"} <= set(reproduced), sorted(reproduced)
    explored = shell("fairfl", "reproduce", "00", "--profile", "smoke", "-p", "rounds=3")
    assert "ok      00_tour.ipynb" in explored and "outputs/smoke/explore/rounds=3/00_tour.ipynb" in explored, explored
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in smoke.iterdir()} == reproduced
    explored_curves = clone / "outputs" / "smoke" / "explore" / "rounds=3" / "00_tour_curves.png"
    assert hashlib.sha256(explored_curves.read_bytes()).hexdigest() != reproduced["00_tour_curves.png"]  # 3 rounds, not 2
    executed = json.loads((explored_curves.parent / "00_tour.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", []))
    (where,) = re.findall(r"figures -> (\S+)", printed)                   # the header line names its folder
    assert Path(where).resolve() == explored_curves.parent.resolve(), where

    # nothing tracked changed: git sees the saved notebooks as committed (its index refreshed by make lab's hook)
    deadline = time.time() + 120
    while _git(clone, "status", "--porcelain", "--untracked-files=no") and time.time() < deadline:
        time.sleep(1)
    assert _git(clone, "status", "--porcelain", "--untracked-files=no") == ""
    assert _git(clone, "diff") == "" and _git(clone, "diff", "HEAD", "--stat") == ""

    # what `make test` reads of the stored notebooks passes on the ones saved with their outputs
    shell(".venv/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_notebooks.py",
          "tests/test_scripts.py", "-k", "00_tour or normalise or stored_python")
    tour = clone / "notebooks" / "00_tour.ipynb"
    before = tour.read_bytes()
    said = shell(".venv/bin/python", "scripts/normalise_notebooks.py", "--help")
    assert said.startswith("usage: normalise_notebooks.py") and "--check" in said, said
    assert tour.read_bytes() == before                                        # --help rewrote nothing
    _git(clone, "config", "--unset", "filter.fairfl-notebook.clean")
    r = subprocess.run([".venv/bin/python", "scripts/normalise_notebooks.py", "--check"], cwd=clone, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout.strip() == "would change: 00_tour.ipynb, 06_one_protocol.ipynb", r.stdout
    said = shell(".venv/bin/python", "scripts/normalise_notebooks.py", "notebooks/00_tour.ipynb")
    assert said.strip() == "rewritten: 00_tour.ipynb", said
    assert _git(clone, "diff", "HEAD", "--stat", "--", "notebooks/00_tour.ipynb") == ""   # the committed file again


def _serves_the_repository_root(url: str, token: str) -> None:
    """The server `make lab ARGS=...` started: its file browser at the repository root (figures/
    beside notebooks/), and the landing page in notebooks/."""
    import urllib.error
    with urllib.request.urlopen(f"{url}/api/contents?token={token}", timeout=10) as r:
        names = {item["name"] for item in json.load(r)["content"]}
    assert {"notebooks", "figures", "README.md", "Makefile"} <= names, names

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None
    try:
        urllib.request.build_opener(NoRedirect).open(f"{url}/?token={token}", timeout=10)
        where = None
    except urllib.error.HTTPError as e:
        where = e.headers.get("Location")
    assert where is not None and where.split("?")[0].endswith("/lab/tree/notebooks"), where


def _up(url: str, token: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
