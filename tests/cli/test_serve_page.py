"""``msgindex serve``'s search page in a real headless browser (Debian's chromium, driven by
Selenium through chromedriver) against a real index and a real broker: search, results with
dates, the timeline, a payload, pagination, relative windows, a scan's notice, a bad time.

Screenshots of every step go to ``$MSGINDEX_SCREENSHOTS`` (default: the test's temp folder)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest

from tests.cli.conftest import MSGINDEX

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1100")
WAIT_S = 20


@pytest.fixture(scope="module")
def browser():
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not Path(path).exists()]
    if missing:
        pytest.skip(f"no headless browser: {', '.join(missing)} missing (Debian: apt-get install chromium "
                    f"chromium-driver; .ci/run installs them)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (the dev extra has it)")
    profile = tempfile.mkdtemp(prefix="msgindex-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def page(incident_index):
    """The real console script serving the index on a free port; its address."""
    server = subprocess.Popen([MSGINDEX, "serve", str(incident_index.path), "--port", "0",
                               "--bootstrap-servers", incident_index.bootstrap],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("msgindex serve: http://127.0.0.1:"), line
        yield line.split()[2]
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def shots(tmp_path):
    folder = Path(os.environ.get("MSGINDEX_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def wait(browser, condition):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, WAIT_S).until(condition)


def by_id(browser, name):
    from selenium.webdriver.common.by import By

    return browser.find_element(By.ID, name)


def rows(browser) -> list[list[str]]:
    from selenium.webdriver.common.by import By

    return [[cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
            for row in browser.find_elements(By.CSS_SELECTOR, "#results tbody tr:not(.payload-row)")]


def open_page(browser, url):
    browser.get(url)
    wait(browser, lambda b: "messages" in by_id(b, "index-info").text)


def search(browser, value="", begin=None, end=None):
    for name, text in (("value", value), ("begin", begin), ("end", end)):
        if text is not None:
            by_id(browser, name).clear()
            by_id(browser, name).send_keys(text)
    before = by_id(browser, "summary").text
    by_id(browser, "search").click()
    wait(browser, lambda b: by_id(b, "summary").text != before or by_id(b, "error").text)


def test_search_a_key_results_timeline_and_a_payload(browser, page, incident_index, shots):
    from selenium.webdriver.common.by import By

    open_page(browser, page)
    assert f"{len(incident_index.messages):,} messages" in by_id(browser, "index-info").text
    search(browser, "order-00321")
    assert by_id(browser, "summary").text.startswith("6 messages under key “order-00321” · window any time")
    shown = rows(browser)
    assert len(shown) == 6
    story = sorted(incident_index.of_key("order-00321"), key=lambda m: m.timestamp_ms)
    from msgindex.times import format_ms

    assert [row[0] for row in shown] == [format_ms(m.timestamp_ms).replace("T", " ")[:-1] for m in story]
    assert {row[1] for row in shown} == {incident_index.orders, incident_index.payments}
    dots = browser.find_elements(By.CSS_SELECTOR, "#timeline svg circle.hit")
    lanes = browser.find_elements(By.CSS_SELECTOR, "#timeline svg text.lane-label")
    assert len(dots) == 6 and len(lanes) == 2
    browser.save_screenshot(str(shots / "1-search.png"))

    declined = next(i for i, m in enumerate(story) if json.loads(m.value).get("status") == "declined")
    button = browser.find_elements(By.CSS_SELECTOR, "#results tbody tr:not(.payload-row) .payload-button")[declined]
    button.click()
    wait(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "pre.payload"))
    payload = browser.find_element(By.CSS_SELECTOR, "pre.payload").text
    assert json.loads(payload) == json.loads(story[declined].value)
    assert '"reason": "issuer timeout"' in payload
    assert "headers: UNIQ_KEY=pay-" in browser.find_element(By.CSS_SELECTOR, "tr.payload-row").text
    browser.save_screenshot(str(shots / "2-payload.png"))


def test_pagination(browser, page, incident_index, shots):
    hits = len(incident_index.of_key("order-00000"))
    assert hits > 100
    open_page(browser, page)
    search(browser, "order-00000")
    pages = -(-hits // 50)
    assert by_id(browser, "page-info").text == f"rows 1–50 of {hits:,} · page 1 of {pages}"
    assert not by_id(browser, "prev").is_enabled() and by_id(browser, "next").is_enabled()
    first = rows(browser)
    by_id(browser, "next").click()
    wait(browser, lambda b: "page 2 of" in by_id(b, "page-info").text)
    second = rows(browser)
    assert len(second) == 50 and second[0][0] >= first[-1][0] and second[0] != first[0]
    browser.save_screenshot(str(shots / "3-page-2.png"))
    for _ in range(pages - 2):
        by_id(browser, "next").click()
        wait(browser, lambda b, n=_ + 3: f"page {n} of" in by_id(b, "page-info").text)
    assert len(rows(browser)) == hits - 50 * (pages - 1) and not by_id(browser, "next").is_enabled()


def test_relative_window_and_a_scan_says_so(browser, page, incident_index, shots):
    from selenium.webdriver.common.by import By

    open_page(browser, page)
    by_id(browser, "value").send_keys("order-00321")
    browser.find_element(By.CSS_SELECTOR, "[data-since='-24h']").click()
    wait(browser, lambda b: "window 20" in by_id(b, "summary").text)
    assert by_id(browser, "begin").get_attribute("value") == "-24h"
    summary = by_id(browser, "summary").text
    assert " .. any time (UTC)" in summary and summary.startswith("6 messages")
    search(browser, "", begin="-2h", end="now")  # no key: the window's messages, and the page says it reads them all
    notice = by_id(browser, "notice")
    assert notice.is_displayed() and notice.text.startswith("No key:") and "a scan" in notice.text
    assert len(rows(browser)) == 50 and by_id(browser, "next").is_enabled()
    browser.save_screenshot(str(shots / "4-scan.png"))


def test_a_bad_time_is_a_message_next_to_it(browser, page, shots):
    open_page(browser, page)
    search(browser, "order-00321", begin="5 o'clock")
    assert by_id(browser, "error").text.startswith("'begin' = \"5 o'clock\" is not a time: give epoch ms, ISO-8601")
    assert "invalid" in by_id(browser, "begin").get_attribute("class")
    browser.save_screenshot(str(shots / "5-bad-time.png"))
    search(browser, "order-00321", begin="2026-11-25 10:00", end="2026-11-25 09:00")
    assert "is after end" in by_id(browser, "error").text


def test_the_api_answers_without_a_browser(page, incident_index):
    with urllib.request.urlopen(f"{page}api/search?value=order-00321&size=2") as response:
        body = json.loads(response.read())
    assert body["total"] == 6 and len(body["rows"]) == 2 and body["more"] and body["mode"] == "lookup"
    assert len(body["timeline"]["points"]) == 6
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(f"{page}api/search?value=x&topic=nope")
    error = json.loads(bad.value.read())
    assert bad.value.code == 400 and error["field"] == "topic" and "the index has no such topic" in error["error"]


def test_the_api_looks_up_a_value_exactly_as_given(tmp_path):
    """Keys that begin or end with spaces are keys (an attack run found ' k1' answered as 'k1',
    and ' ' as a scan of the whole index); only an empty value scans. Another server, over a
    store of its own (no broker: no payloads asked)."""
    from urllib.parse import quote

    from msgindex.storage.message import MessageRecord
    from msgindex.storage.store import open_store

    keys = ["k1", " k1", "k1 ", " "]
    with open_store(tmp_path / "store", create=True) as store, store.writer("b0") as writer:
        writer.append([MessageRecord("t", 0, i, 1_700_000_000_000 + i, key, (key,)) for i, key in enumerate(keys)])
    server = subprocess.Popen([MSGINDEX, "serve", str(tmp_path / "store"), "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        address = server.stdout.readline().split()[2]
        for key in keys:
            with urllib.request.urlopen(f"{address}api/search?value={quote(key)}") as response:
                body = json.loads(response.read())
            assert body["mode"] == "lookup" and [row["key"] for row in body["rows"]] == [key], key
        with urllib.request.urlopen(f"{address}api/search?value=") as response:
            assert json.loads(response.read())["mode"] == "scan"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_search_by_an_indexed_field_and_see_what_each_message_carries(browser, page, incident_index, shots):
    """The index's field (the demo's payload ``status``) is a choice of the search box, found by
    its index, and every row shows the field values its message carries."""
    from selenium.webdriver.support.ui import Select

    declined = incident_index.of_status("declined")
    assert declined
    open_page(browser, page)
    Select(by_id(browser, "field")).select_by_value("status")
    search(browser, "declined")
    assert by_id(browser, "summary").text.startswith(f"{len(declined)} message")
    assert "under status “declined”" in by_id(browser, "summary").text
    shown = rows(browser)
    assert len(shown) == min(len(declined), 50) and {row[7] for row in shown} == {"status=declined"}
    browser.save_screenshot(str(shots / "6-field.png"))
    search_key = incident_index.of_key("order-00321")
    Select(by_id(browser, "field")).select_by_value("key")
    search(browser, "order-00321")
    statuses = {json.loads(m.value).get("status") for m in search_key} - {None}
    assert {row[7] for row in rows(browser)} - {""} == {f"status={s}" for s in statuses}


def test_the_api_searches_a_field_and_names_one_it_does_not_have(page, incident_index):
    with urllib.request.urlopen(f"{page}api/info") as response:
        assert [f["name"] for f in json.loads(response.read())["fields"]] == ["key", "status"]
    with urllib.request.urlopen(f"{page}api/search?field=status&value=declined&size=500") as response:
        body = json.loads(response.read())
    declined = incident_index.of_status("declined")
    assert body["total"] == len(declined) and sorted((row["topic"], row["key"]) for row in body["rows"]) == sorted(
        (m.topic, m.key.decode()) for m in declined)
    assert body["notice"] is None and all(row["fields"] == {"status": "declined"} for row in body["rows"])
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(f"{page}api/search?field=colour&value=red")
    error = json.loads(bad.value.read())
    assert bad.value.code == 400 and error["field"] == "field" and error["error"] == (
        "no field 'colour' to search by (fields: key, status)")
