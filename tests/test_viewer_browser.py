"""The viewer in a real browser: headless Chromium (Debian's `chromium` + `chromium-driver`)
driven by Selenium, on a journal the real Claude Code CLI (2.1.197, from npm) wrote.

The adapter runs with `--restore tree_only`: Claude Code's re-rendered Edit and Write echoes are
restored in the tree but their prompts are the harness's bytes, so their turns' tokens are
realigned (masked) and the page has a masked turn to click into. While the adapter runs, its
`/tokentrail/ui` is checked behind the admin token against the ledger `/finish` then answers;
afterwards `tokentrail view JOURNAL` is checked against the journal's ledger, and a masked
turn's tokens against the ledger's counts. Screenshots go to `artifacts/viewer/`; with
`TOKENTRAIL_DOCS_SCREENSHOTS=1` the ones the docs show are written into `docs/images/viewer/`
too (the viewer page includes them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from support.claude_code import CLAUDE_CODE_VERSION, install_claude_code, run_claude
from support.serve import ADMIN_TOKEN, free_port, serving
from tokentrail.storage.export import write_samples
from tokentrail.storage.journal.read import read_journal
from tokentrail.storage.replay import as_recorded

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts" / "viewer"
DOCS_IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images" / "viewer"
# The screenshots docs/operating/viewer.md shows.
DOCS_SHOWS = {"sessions.png", "session.png", "masked_turn.png", "exported_sample.png"}
SID = "cc-viewer"
VIEW_TOKEN = "view-token"
CALC = "def add(a, b):\n    return a+b   \n\nprint(add(1, 2))\n"


def _missing(reason: str) -> None:
    # CI installs them (.ci/run): there a missing browser is a failure, never a skip.
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    print(f"\n*** SKIPPING the browser test: {reason} ***", file=sys.stderr)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        _missing("Debian's chromium and chromium-driver are not installed")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,1000")
    # The driver given by path: Selenium Manager downloads nothing.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def claude_exe() -> Path:
    if subprocess.run(["which", "npm"], capture_output=True).returncode != 0:
        _missing("npm is missing: cannot install the Claude Code CLI")
    exe = install_claude_code(version=CLAUDE_CODE_VERSION)
    assert exe is not None
    return exe


def _script(repo: Path) -> list:
    calc, util = str(repo / "calc.py"), str(repo / "util.py")
    return [
        [
            {"type": "text", "text": "Let me look at calc.py first."},
            {"type": "tool_use", "name": "Read", "input": {"file_path": calc}},
        ],
        [
            {
                "type": "tool_use",
                "name": "Edit",
                "input": {
                    "file_path": calc,
                    "old_string": "    return a+b   \n",
                    "new_string": "    # sum of a and b   \n    return a + b\n",
                },
            }
        ],
        [
            {
                "type": "tool_use",
                "name": "Write",
                "input": {"file_path": util, "content": "def mul(a, b):   \n    return a * b  \n"},
            }
        ],
        [{"type": "text", "text": "Fixed the spacing and added util.py."}],
    ]


def _wait(driver, css: str, timeout: float = 10):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(
        ec.visibility_of_element_located((By.CSS_SELECTOR, css))
    )


def _text(driver, css: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, css).text


def _num(text: str) -> int:
    return int(text.replace(",", ""))


def _page_numbers(driver) -> dict:
    """What the session page shows: its cards, each turn's row and each tool's row."""
    from selenium.webdriver.common.by import By

    _wait(driver, "#tree")
    cards = {
        c.get_attribute("data-field"): _num(c.text)
        for c in driver.find_elements(By.CSS_SELECTOR, ".card b[data-field]")
        if c.get_attribute("data-field") in ("generated", "trained", "masked")
        or c.get_attribute("data-field").startswith("masked-")
    }
    turns = [
        (
            int(row.get_attribute("data-turn")),
            _num(row.find_element(By.CSS_SELECTOR, "[data-field=generated]").text),
            _num(row.find_element(By.CSS_SELECTOR, "[data-field=trained]").text),
            row.find_element(By.CSS_SELECTOR, "[data-field=masked]").text,
        )
        for row in driver.find_elements(By.CSS_SELECTOR, "#turns tbody tr")
    ]
    tools = {
        row.get_attribute("data-tool"): (
            _num(row.find_element(By.CSS_SELECTOR, "[data-field=tool-trained]").text),
            _num(row.find_element(By.CSS_SELECTOR, "[data-field=tool-masked]").text),
        )
        for row in driver.find_elements(By.CSS_SELECTOR, "#by-tool tbody tr")
    }
    return {"cards": cards, "turns": turns, "tools": tools}


def _ledger_numbers(ledger: dict) -> dict:
    """The same numbers, from the ledger JSON."""
    cards = {
        "generated": ledger["generated_tokens"],
        "trained": ledger["trained_tokens"],
        "masked": sum(ledger["masked_tokens"].values()),
        **{f"masked-{r}": n for r, n in ledger["masked_tokens"].items()},
    }
    turns = [
        (
            t["turn_index"],
            t["generated"],
            t["trained"],
            ", ".join(f"{r} {n}" for r, n in t["masked"].items()),
        )
        for t in ledger["turns"]
    ]
    tools = {k: (r["tokens_trained"], r["tokens_masked"]) for k, r in ledger["by_tool"].items()}
    return {"cards": cards, "turns": turns, "tools": tools}


def _gone(driver, css: str, timeout: float) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout).until(lambda d: not d.find_elements(By.CSS_SELECTOR, css))


def test_viewer_numbers_are_the_ledger_s_live_and_from_the_journal(
    browser, claude_exe: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driver = browser
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    script = tmp_path / "script.json"
    script.write_text(json.dumps(_script(repo)))
    journal = tmp_path / "journal.db"
    with serving(script, "--journal", str(journal), "--restore", "tree_only") as served:
        run = run_claude(
            claude_exe,
            "Fix the spacing in calc.py and add util.py with mul().",
            base_url=served.url,
            session_id=SID,
            cwd=repo,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[-2000:]

        # The adapter's viewer: the API is closed without the admin token ...
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{served.url}/tokentrail/ui/api/sessions", timeout=10)
        assert refused.value.code == 401
        assert json.loads(refused.value.read())["error"]["type"] == "authentication_error"
        # ... and the page asks for it, then shows the live session.
        driver.get(f"{served.url}/tokentrail/ui/")
        _wait(driver, "#login").find_element(By.ID, "token").send_keys(ADMIN_TOKEN)
        driver.find_element(By.CSS_SELECTOR, "#login button").click()
        _wait(driver, f"tr[data-sid='{SID}']").click()
        live = _page_numbers(driver)
        _screenshot(driver, "live_session.png")
        # Live: the sessions list drops the session by itself (polling) once it is finished.
        driver.get(f"{served.url}/tokentrail/ui/#/")
        _wait(driver, f"tr[data-sid='{SID}']")
        finished = served.finish(SID)
        _gone(driver, f"tr[data-sid='{SID}']", timeout=10)
        # What the live page showed is what finishing the session answered.
        assert live == _ledger_numbers(finished["ledger"])

    ledger = as_recorded(read_journal(journal))[SID].ledger.to_dict()
    assert ledger == finished["ledger"]
    masked_turns = [t for t in ledger["turns"] if t["masked"]]
    assert masked_turns, f"restore=tree_only left no masked turn: {ledger['turns']}"

    with viewing(journal) as url:
        driver.get(f"{url}/?token={VIEW_TOKEN}")  # the URL `tokentrail view` prints
        row = _wait(driver, f"tr[data-sid='{SID}']")
        assert (
            _num(row.find_element(By.CSS_SELECTOR, "[data-field=generated]").text)
            == (ledger["generated_tokens"])
        )
        assert (
            _num(row.find_element(By.CSS_SELECTOR, "[data-field=trained]").text)
            == (ledger["trained_tokens"])
        )
        _screenshot(driver, "sessions.png")
        row.click()
        assert _page_numbers(driver) == _ledger_numbers(ledger)
        _screenshot(driver, "session.png")

        # Into a masked turn, from its node in the tree.
        masked = masked_turns[0]
        node = f"#tree .node[data-turn='{masked['turn_index']}']"
        driver.find_element(By.CSS_SELECTOR, node).click()
        _wait(driver, "#tokens")
        assert "ok" in driver.find_element(By.ID, "turn-consistent").get_attribute("class")
        assert _num(_text(driver, "[data-field=trained]")) == masked["trained"]
        for reason, n in masked["masked"].items():
            assert _num(_text(driver, f"[data-field=masked-{reason}]")) == n
            spans = driver.find_elements(By.CSS_SELECTOR, f"#tokens span.f-{reason}")
            assert len(spans) == n
        assert (
            len(driver.find_elements(By.CSS_SELECTOR, "#tokens span.f-trained"))
            == (masked["trained"])
        )
        # Hovering an output token tells its id, fate and logprob.
        token = driver.find_element(By.CSS_SELECTOR, "#tokens span[data-k=o]")
        ActionChains(driver).move_to_element(token).perform()
        tip = _wait(driver, "#tip").text
        assert "id " in tip and "fate " in tip and "logprob " in tip and "weights " in tip
        _screenshot(driver, "masked_turn.png")

    # The same session's exported samples: what each sample's loss mask trains.
    trajectory = as_recorded(read_journal(journal))[SID]
    exported = tmp_path / "done.jsonl"
    write_samples(exported, trajectory.samples)
    with viewing(exported, "--tokenizer", "builtin:qwen3") as url:
        driver.get(f"{url}/?token={VIEW_TOKEN}#/s/{SID}")
        assert _num(_wait(driver, ".card [data-field=trained]").text) == ledger["trained_tokens"]
        driver.find_element(By.CSS_SELECTOR, "#samples tr[data-sample='0']").click()
        box = _wait(driver, "#tokens")
        sample = trajectory.samples[0]
        # Tokens are rendered lazily: 2,000 at first, the next 2,000 as the reader scrolls down.
        assert int(box.get_attribute("data-rendered")) == 2000 < len(sample.tokens)
        driver.execute_script("document.querySelector('#tokens .more').scrollIntoView()")
        _rendered(driver, 4000)
        assert "not_trained" in _text(driver, ".legend")
        _screenshot(driver, "exported_sample.png")


def _screenshot(driver, name: str) -> None:
    """Save a screenshot under artifacts/, and into the docs when they show it and are asked."""
    driver.save_screenshot(str(ARTIFACTS / name))
    if name in DOCS_SHOWS and os.environ.get("TOKENTRAIL_DOCS_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(DOCS_IMAGES / name))


def _rendered(driver, n: int, timeout: float = 20) -> None:
    """Wait until the token list holds `n` rendered tokens."""
    from selenium.webdriver.support.ui import WebDriverWait

    def done(d) -> bool:
        box = d.find_elements(By.ID, "tokens")
        return bool(box) and box[0].get_attribute("data-rendered") == str(n)

    WebDriverWait(driver, timeout).until(done)


@contextmanager
def viewing(path: Path, *args: str) -> Iterator[str]:
    """`tokentrail view PATH` on a free port; its URL once it answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    view = subprocess.Popen(
        [
            *(sys.executable, "-m", "tokentrail", "view", str(path)),
            *("--port", str(port), "--token", VIEW_TOKEN, *args),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_healthy_view(url, view)
        yield url
    finally:
        view.terminate()
        view.wait(timeout=30)


def wait_healthy_view(url: str, proc: subprocess.Popen) -> None:
    """`tokentrail view` answers its API once it has read the journal."""
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise RuntimeError(f"tokentrail view exited with {proc.returncode}: {out}")
        try:
            ask = urllib.request.Request(
                f"{url}/api/source", headers={"Authorization": f"Bearer {VIEW_TOKEN}"}
            )
            with urllib.request.urlopen(ask, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("tokentrail view did not come up")
