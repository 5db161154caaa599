"""``minipar notebooks --html DIR``: notebooks executed and written as HTML, with an index in
the learning path's order, read in headless Chromium where it is installed (always in CI):
a real notebook's page, its explorer's default view (figure and numbers); bad input is one
line and exit 2."""

from __future__ import annotations

import json
import os

import pytest
from conftest import CHROMIUM, DRIVER, FLAGS, SHOTS

from minipar.cli import main
from minipar.cli import notebooks as verb


def _notebook(path, heading, code):
    cells = [{"cell_type": "markdown", "id": "a", "metadata": {}, "source": heading},
             {"cell_type": "code", "id": "b", "metadata": {}, "execution_count": None,
              "outputs": [], "source": code}]
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}), encoding="utf-8")


#: the real notebook the book test renders and reads: the quickest with an explorer
REAL = "05_tensor_parallel"


def test_pages_with_figures_and_an_index_in_order(tmp_path, monkeypatch, capsys):
    """A real notebook (its explorer's default view drawn headless) and a broken one."""
    pytest.importorskip("nbconvert")
    src = tmp_path / "notebooks"
    src.mkdir()
    real = verb.NOTEBOOKS / f"{REAL}.ipynb"
    (src / real.name).write_text(real.read_text(encoding="utf-8"), encoding="utf-8")
    _notebook(src / "02_c.ipynb", "# 02 · broken", "raise ValueError('on purpose')")
    monkeypatch.setattr(verb, "NOTEBOOKS", src)
    out = tmp_path / "book"
    assert main(["notebooks", "--html", str(out), "--quick"]) == 1  # one notebook failed
    page = (out / f"{REAL}.html").read_text(encoding="utf-8")
    explorer = page[page.index('id="cell-id=x37-05-explore"'):]
    explorer = explorer[:explorer.index('id="cell-id=x37-05-predict"')]
    assert "data:image/png;base64" in explorer and "bytes one rank sends per block" in explorer
    idx = (out / "index.html").read_text(encoding="utf-8")
    assert idx.index("02_c.html") < idx.index(f"{REAL}.html")
    assert verb.title(json.loads(real.read_text(encoding="utf-8"))) in idx
    assert "failed: ValueError: on purpose" in idx
    assert "FAILED: ValueError: on purpose" in capsys.readouterr().out
    if CHROMIUM.exists() or os.environ.get("CI"):  # the book in a real browser, as a reader
        read_in_chromium(out, tmp_path)


def read_in_chromium(book, tmp_path):
    """Open the book's index in headless Chromium, follow the real notebook's link, see its
    explorer's default view: the figure drawn and its numbers."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for f in (*FLAGS, f"--user-data-dir={tmp_path / 'chromium'}"):
        opts.add_argument(f)
    driver = webdriver.Chrome(service=Service(str(DRIVER)), options=opts)
    try:
        driver.get((book / "index.html").as_uri())
        driver.find_element(By.LINK_TEXT, REAL).click()
        cell = driver.find_element(By.CSS_SELECTOR, '[id="cell-id=x37-05-explore"]')
        driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", cell)
        img = cell.find_element(By.CSS_SELECTOR, "img[src^='data:image/png']")
        assert driver.execute_script("return arguments[0].naturalWidth", img) > 100
        assert "bytes one rank sends per block" in cell.text
        SHOTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(SHOTS / "04-rendered-book-explorer.png"))
    finally:
        driver.quit()


@pytest.mark.parametrize(("args", "words"), [
    (["--only", "99_nothing"], "--only '99_nothing': no such notebook; one of 00_overview"),
    (["--timeout", "0"], "--timeout must be a positive number of seconds, got 0"),
])
def test_bad_input_is_one_line(args, words, tmp_path, capsys):
    assert main(["notebooks", "--html", str(tmp_path / "x"), *args]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1


def test_a_file_where_the_folder_goes_is_refused(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    assert main(["notebooks", "--html", str(f)]) == 2
    assert "a file is there; give a folder" in capsys.readouterr().err
