#!/usr/bin/env python
"""Open a report (``python -m analysis report``) in headless Chromium at a given window width and list every
table wider than the page: exit status 1 if there is any, 0 if every table fits, 2 if Chromium is missing or
fails.

    python scripts/check_report_layout.py report.html                        # 1280 px, one line per table
    python scripts/check_report_layout.py report.html --screenshot page.png  # and a full-page screenshot
    python scripts/check_report_layout.py report.html --json                 # the measurements as JSON

A table is too wide when its own width (scrollWidth: what its cells need, even where a scrollbar would hide
them) exceeds the width of the text column it sits in (the page's body), or when its right edge passes the
window's. The measurement runs in the page itself: a copy of the report with a small script added, which
writes the widths into the DOM that ``--dump-dom`` prints.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specbench.reporting import reporting_user_errors  # noqa: E402

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")
MEASURED_ID = "layout-measurements"
# Runs after layout; writes one JSON object into a <pre>, which --dump-dom then prints with the rest of the page.
MEASURE_SCRIPT = """
<script>
window.addEventListener("load", function () {
  var body = document.body, style = getComputedStyle(body);
  var column = body.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  var tables = Array.prototype.map.call(document.querySelectorAll("table"), function (table, index) {
    var caption = table.caption ? table.caption.textContent : "";
    var box = table.getBoundingClientRect();
    return {index: index, caption: caption, width: table.scrollWidth, right: box.right,
            columns: table.rows.length ? table.rows[0].cells.length : 0};
  });
  var out = document.createElement("pre");
  out.id = "%s";
  out.textContent = JSON.stringify({window: window.innerWidth, column: column,
                                    document: document.documentElement.scrollWidth, tables: tables});
  body.appendChild(out);
});
</script>
""" % MEASURED_ID


def find_browser() -> str | None:
    """The first Chromium-like browser on PATH, or None."""
    return next((found for name in BROWSERS if (found := shutil.which(name))), None)


def browser_command(browser: str, width: int, height: int) -> list[str]:
    """Headless, sandbox off (root in a container), no GPU, scrollbars hidden so that they take no width."""
    return [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--disable-dev-shm-usage",
            f"--window-size={width},{height}"]


def measure(report: Path, width: int = 1280, height: int = 2000, browser: str | None = None,
            timeout_s: float = 120) -> dict:
    """The page's measurements at ``width`` px: window, text column and document widths, and per table its
    caption, width, right edge and number of columns (``MEASURE_SCRIPT``)."""
    browser = browser or find_browser()
    if browser is None:
        raise RuntimeError("no Chromium found on PATH (apt-get install chromium)")
    text = report.read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "measured.html"
        copy.write_text(text.replace("</body>", MEASURE_SCRIPT + "</body>") if "</body>" in text
                        else text + MEASURE_SCRIPT, encoding="utf-8")
        done = subprocess.run([*browser_command(browser, width, height), "--virtual-time-budget=5000", "--dump-dom",
                               copy.as_uri()], capture_output=True, text=True, timeout=timeout_s)
    found = re.search(rf'<pre id="{MEASURED_ID}">(.*?)</pre>', done.stdout, re.S)
    if not found:
        raise RuntimeError(f"{browser} printed no measurements (exit status {done.returncode}): "
                           f"{done.stderr.strip().splitlines()[-1:] or 'no message'}")
    return json.loads(found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
                      .replace("&amp;", "&"))


def too_wide(measured: dict) -> list[dict]:
    """The tables wider than the text column, or reaching past the window's right edge."""
    return [table for table in measured["tables"]
            if table["width"] > measured["column"] + 0.5 or table["right"] > measured["window"] + 0.5]


def screenshot(report: Path, out: Path, width: int, height: int, browser: str | None = None) -> None:
    """A PNG of the top ``height`` px of the page at ``width`` px."""
    browser = browser or find_browser()
    subprocess.run([*browser_command(browser, width, height), f"--screenshot={out.resolve()}",
                    report.resolve().as_uri()], capture_output=True, timeout=120, check=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report", type=Path)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--screenshot", type=Path, help="also write a PNG of the page")
    parser.add_argument("--screenshot-height", type=int, default=6000)
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")
    args = parser.parse_args(argv)
    try:
        measured = measure(args.report, args.width)
        if args.screenshot:
            screenshot(args.report, args.screenshot, args.width, args.screenshot_height)
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        print(f"check_report_layout: {error}", file=sys.stderr)
        return 2
    wide = too_wide(measured)
    if args.json:
        print(json.dumps({**measured, "too_wide": wide}, indent=1))
    else:
        widest = max((table["width"] for table in measured["tables"]), default=0)
        print(f"{len(measured['tables'])} tables at {measured['window']} px (text column {measured['column']:.0f} px, "
              f"page {measured['document']} px wide); widest {widest} px")
        for table in wide:
            print(f"TOO WIDE: table {table['index']} '{table['caption']}': {table['width']} px, {table['columns']} "
                  f"columns, right edge at {table['right']:.0f} px")
        print("every table fits" if not wide else f"{len(wide)} table(s) wider than the page")
    return 1 if wide else 0


if __name__ == "__main__":
    sys.exit(reporting_user_errors("check_report_layout", main)())
