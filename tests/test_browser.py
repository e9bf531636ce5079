"""The HTML report in a real headless browser: loads offline, every figure decodes, no broken links.

Needs Debian's chromium (`apt-get install -y chromium`); skipped with a reason when it is absent.
A copy of the report gets a probe script appended (the report itself has no scripts): after the
load event it writes what the browser sees into the DOM, which `--dump-dom` prints.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fixtures.reports_data import synthetic_result
from objdebug.report import html as html_report
from objdebug.report import json_report
from objdebug.report.figures import draw_all

pytestmark = pytest.mark.browser

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome"))
                 if p), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed "
                                    "(apt-get install -y chromium) — the HTML report is not browser-checked")

_PROBE = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images).map(function (i) {
    return {alt: i.alt, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight}; });
  var links = Array.prototype.slice.call(document.querySelectorAll('a[href]')).map(function (a) {
    var h = a.getAttribute('href');
    return {href: h, ok: h.charAt(0) === '#' && document.getElementById(h.slice(1)) !== null}; });
  var out = document.createElement('pre'); out.id = 'objdebug-probe';
  out.textContent = '@@' + 'PROBE' + JSON.stringify({images: imgs, links: links,
    resources: performance.getEntriesByType('resource').map(function (e) { return e.name; }),
    title: document.title}) + 'EBORP' + '@@';  // split markers: the script's own text never matches
  document.body.appendChild(out);
});
</script>"""

_ARGS = ["--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-extensions",
         "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: any network lookup fails
         "--virtual-time-budget=10000"]


def _chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *_ARGS, f"--user-data-dir={tmp / 'profile'}", *args],
                          capture_output=True, text=True, timeout=90)


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("html")
    report = json_report.to_dict(synthetic_result())
    figures = draw_all(report)
    html_report.write(report, out, figures)
    return out, sum(1 for d in figures if d.png)


@needs_chromium
def test_html_loads_offline_with_every_figure(report_dir, tmp_path):
    out, n_figures = report_dir
    html = (out / "index.html").read_text(encoding="utf-8")
    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("</body>", _PROBE + "</body>"), encoding="utf-8")
    proc = _chromium("--dump-dom", probe.as_uri(), tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r"@@PROBE(.*?)EBORP@@", proc.stdout, re.S)
    assert m, f"probe did not run; chromium printed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    seen = json.loads(m.group(1).replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">"))
    assert seen["title"] == "objdebug report: FAILED"
    assert len(seen["images"]) == n_figures == 6
    for img in seen["images"]:
        assert img["complete"] and img["w"] > 0 and img["h"] > 0, img
    assert seen["links"] and all(link["ok"] for link in seen["links"]), seen["links"]
    assert seen["resources"] == []  # nothing fetched: data URIs only


@needs_chromium
def test_html_screenshot_renders(report_dir, tmp_path):
    out, _ = report_dir
    shot = tmp_path / "shot.png"
    proc = _chromium("--hide-scrollbars", "--window-size=1100,1600", f"--screenshot={shot}",
                     (out / "index.html").as_uri(), tmp=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000  # a blank page compresses to ~5 kB
