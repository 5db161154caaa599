"""The explorers in a real browser: JupyterLab on loopback, driven in headless Chromium.

A notebook made of the explorer cells of every notebook (the cells as the learner meets
them: ids ``x37-*``) is opened in JupyterLab, all cells run; then one control of each
explorer is moved and its numbers must change, and one predict-then-measure button is
pressed (a run on 2 real ranks) and must show the measured value beside the formula.
Screenshots are kept in ``build/browser-test/`` (ignored by git; CI's artefacts).  Debian's
``chromium`` and ``chromium-driver`` (.ci/run installs them); where /usr/bin/chromium is
absent (a developer's machine) the test skips with one line.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import CHROMIUM, DRIVER, FLAGS, SHOTS

ROOT = Path(__file__).resolve().parent.parent
#: explorer cell id -> (the control to move: its ipywidgets class suffix, the choice to pick)
MOVES = {"x37-01-explore": ("algorithm", "tree"), "x37-03-explore": ("zero", "3"),
         "x37-04-explore": ("precision", "fp32"), "x37-05-explore": ("t", "2"),
         "x37-06-explore": ("kind", "gpipe"), "x37-08-explore": ("top_k", "1"),
         "x37-10-explore": ("tp", "4"), "x37-10-memory": ("zero", "3")}
PRESS = "dp-bytes"  # the predict-then-measure button pressed (minipar run dp -n 2)

#: in CI (.ci/run sets up Chromium) the browser must be there: no skip
pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and DRIVER.exists()) and not os.environ.get("CI"),
    reason="no /usr/bin/chromium and chromedriver (Debian's chromium, chromium-driver; "
           ".ci/run installs them)")


def explorer_notebook(path: Path) -> list[str]:
    """Write the explorer cells of every notebook into one notebook; their ids in order."""
    import nbformat

    cells = []
    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(nb_path, as_version=4)
        cells += [c for c in nb.cells if c.get("id", "").startswith("x37-")
                  and c.cell_type == "code" and "problems" not in c.source]
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, path)
    return [c.id for c in cells]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check, timeout: float = 120.0, every: float = 0.25):
    """Poll ``check()`` until it returns something true; fail naming ``what`` at the
    timeout (a bound, not a wait: polling stops as soon as it holds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    pytest.fail(f"browser test: {what} within {timeout:g} s")


@pytest.fixture
def lab(tmp_path):
    work = tmp_path / "lab"
    work.mkdir()
    ids = explorer_notebook(work / "explorers.ipynb")
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "MINIPAR_NOTEBOOK_QUICK": "1", "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"), "TMPDIR": str(tmp_path)}
    labconfig = tmp_path / "cfg" / "labconfig"  # no "news?" pop-up over the screenshots
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(json.dumps({"disabledExtensions": {
        "@jupyterlab/apputils-extension:announcements": True}}), encoding="utf-8")
    log = (tmp_path / "lab.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
         f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}",
         "--LabApp.expose_app_in_browser=True", "--ServerApp.disable_check_xsrf=True",
         "--allow-root", "--ServerApp.terminals_enabled=False",
         "--LabApp.extension_manager=readonly", "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                return r.status == 200
        except OSError:
            if proc.poll() is not None:
                pytest.fail("jupyter lab exited: " + (tmp_path / "lab.log").read_text()[-2000:])
            return False
    try:
        wait_for("JupyterLab answering on loopback", up, 90)
        yield f"{url}/lab/tree/explorers.ipynb?token={token}", ids
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for f in (*FLAGS, f"--user-data-dir={tmp_path / 'chromium'}"):
        opts.add_argument(f)
    driver = webdriver.Chrome(service=Service(str(DRIVER)), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def cell(driver, cid: str):
    """The DOM node of the cell whose id is ``cid``, scrolled into view."""
    node = driver.execute_script(
        "const nb = window.jupyterapp.shell.currentWidget.content;"
        "const w = nb.widgets.find(c => c.model.id === arguments[0]);"
        "if (!w) return null; w.node.scrollIntoView({block: 'start'}); return w.node;", cid)
    assert node is not None, f"no cell {cid} in the notebook"
    return node


def output_text(driver, cid: str) -> str:
    """The text outputs of cell ``cid``, read in one script (outputs redrawn meanwhile
    leave no stale reference behind)."""
    return driver.execute_script(
        "const nb = window.jupyterapp.shell.currentWidget.content;"
        "const w = nb.widgets.find(c => c.model.id === arguments[0]);"
        "return Array.from(w.node.querySelectorAll('.jp-OutputArea-output pre'))"
        ".map(e => e.innerText).join(' ');", cid)


def test_explorers_move_and_a_prediction_is_measured_in_jupyterlab(lab, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url, ids = lab
    SHOTS.mkdir(parents=True, exist_ok=True)
    browser.get(url)
    wait_for("the notebook open with an idle kernel", lambda: browser.execute_script(
        "const a = window.jupyterapp; const w = a && a.shell.currentWidget;"
        "return !!(w && w.sessionContext && w.sessionContext.session &&"
        " w.sessionContext.session.kernel && w.sessionContext.session.kernel.status"
        " === 'idle');"), 120)
    browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")

    def all_ran() -> bool:
        prompts = browser.find_elements(By.CSS_SELECTOR, ".jp-InputArea-prompt")
        done = [p.text for p in prompts if p.text.strip() not in ("", "[ ]:", "[*]:")]
        return len(done) == len(ids)
    wait_for("every cell run", all_ran, 180)
    errors = browser.find_elements(By.CSS_SELECTOR,
                                   '[data-mime-type="application/vnd.jupyter.stderr"]')
    assert not [e.text for e in errors if "Traceback" in e.text or "Error" in e.text]
    browser.save_screenshot(str(SHOTS / "01-all-cells-run.png"))
    for cid, (control, choice) in MOVES.items():
        before = output_text(browser, cid)
        assert before, f"{cid}: no numbers drawn"
        box = cell(browser, cid).find_element(By.CSS_SELECTOR,
                                              f".minipar-control-{control} select")
        Select(box).select_by_visible_text(choice)
        after = wait_for(f"{cid}'s numbers to change when {control} = {choice}",
                         lambda: (t := output_text(browser, cid)) != before and t, 60)
        assert "not a valid choice" not in after, after
        browser.save_screenshot(str(SHOTS / f"02-{cid}-{control}-{choice}.png"))
    pid = "x37-03-predict"
    box = cell(browser, pid).find_element(By.CSS_SELECTOR, f".minipar-predict-{PRESS} input")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", box)
    box.send_keys("112,640")  # the usual mistake: 2S
    cell(browser, pid).find_element(By.CSS_SELECTOR, f".minipar-measure-{PRESS}").click()
    verdict = wait_for("the measured run's verdict", lambda: (t := output_text(browser, pid))
                       and "measured on real ranks" in t and t, 120)
    browser.save_screenshot(str(SHOTS / "03-predict-then-measure.png"))
    assert "measured on real ranks: 56,320 B" in verdict and "formula: 56,320 B" in verdict
    assert "your prediction: 112,640 B — not quite" in verdict
    (SHOTS / "verdict.json").write_text(json.dumps({"verdict": verdict}), encoding="utf-8")
