"""Reports: JSON/JUnit/Markdown golden files, HTML self-containment, figures, the CLI gate, render,
select/ignore and the shipped profiles.

Golden files live in tests/golden/; regenerate with OBJDEBUG_UPDATE_GOLDEN=1 after an intended
change and review the diff. The synthetic report (fixtures/reports_data.py) needs no MindSpore;
the CLI tests run the align stage on fixtures/targets/reports_tiny (one tiny model, ~6 s a run).
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fixtures.reports_data import TRACEBACK, synthetic_result
from objdebug.report import html as html_report
from objdebug.report import json_report, junit, markdown, terminal
from objdebug.report.figures import FIGURES, draw_all

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden"
TARGET = ROOT / "fixtures" / "targets" / "reports_tiny"
LENIENT = TARGET / "lenient.toml"
BROKEN = ["--set", "data.label_pad_id=0", "--set", "objective.factory=mindspore.nn:CrossEntropyLoss"]


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("OBJDEBUG_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"missing golden file {path}; run with OBJDEBUG_UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8"), f"{name} differs from its golden file"


@pytest.fixture(scope="module")
def report():
    return json_report.to_dict(synthetic_result())


# --------------------------------------------------------------------------- golden files
def test_json_golden():
    check_golden("synthetic.json", json_report.dumps(synthetic_result()))


def test_junit_golden(report):
    check_golden("synthetic.junit.xml", junit.dumps(report))


def test_markdown_golden(report):
    check_golden("synthetic.md", markdown.render(report))


# --------------------------------------------------------------------------- terminal
def test_terminal_golden(report):
    check_golden("synthetic.txt", terminal.render(report))
    check_golden("synthetic.verbose.txt", terminal.render(report, verbose=True))


def test_terminal_counts_passes_and_skips_per_stage_and_details_the_rest(report):
    """pytest / ruff style: a line of counts per stage, FAIL / WARN / ERROR / INFO in full, passes
    and skips only counted (a real run has some 60 findings); -v: the table of every finding."""
    text = terminal.render(report)
    lines = text.splitlines()
    assert "align      1 pass, 1 warn, 1 fail" in lines and "stress     1 error, 1 skipped" in lines
    assert "OBJ101" not in text and "OBJ504" not in text  # a pass and a skip: counted, not listed
    for line in ("WARN OBJ102 [align/alignment]", "FAIL OBJ105 [align/label-pad-masking]",
                 "ERROR OBJ503 [stress/garbage-ids]"):
        assert any(x.startswith(line) for x in lines), line
    assert "4 passes and 1 skip not listed; -v lists every finding (skip reasons included)" in lines
    assert lines[-1] == "FAILED: 4 pass, 1 warn, 1 fail, 1 error, 1 skipped (exit 1)"
    verbose = terminal.render(report, verbose=True)
    rows = [x for x in verbose.splitlines() if re.match(r"\w+ +[\w-]+ +OBJ\d{3} ", x)]
    assert len(rows) == sum(len(r["findings"]) for r in report["results"]) == 8
    assert "SKIP OBJ504 [stress/fp16] the model has no fp16 path" in verbose
    assert "not listed" not in verbose and verbose.splitlines()[-1] == lines[-1]


# --------------------------------------------------------------------------- JUnit
def test_junit_structure(report):
    root = ET.fromstring(junit.dumps(report))
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [f"objdebug.{s}" for s in report["stages"]]
    cases = root.findall(".//testcase")
    assert len(cases) == sum(len(r["findings"]) for r in report["results"]) == int(root.get("tests"))
    s = report["summary"]
    assert int(root.get("failures")) == s["FAIL"] + s["WARN"]
    assert int(root.get("errors")) == s["ERROR"] == 1
    assert int(root.get("skipped")) == s["SKIP"]
    fail = root.find(".//testcase[@name='OBJ105 label_pad_not_scored']/failure")
    assert fail.get("type") == "FAIL" and "fix: Make the objective's ignore_index" in fail.text
    error = root.find(".//error")
    assert error.get("type") == "ERROR" and TRACEBACK in error.text
    # suite time = sum of its checks' seconds
    align = root.find("testsuite[@name='objdebug.align']")
    assert float(align.get("time")) == pytest.approx(1.25 + 0.5)


def test_junit_warnings_as_skipped(report):
    root = ET.fromstring(junit.dumps(report, warnings_as_skipped=True))
    warn = root.find(".//testcase[@name='OBJ102 order_accuracy_not_less_than_0.9']")
    assert warn.find("failure") is None and warn.find("skipped").get("message").startswith("WARN: ")
    assert int(root.get("failures")) == report["summary"]["FAIL"]
    assert int(root.get("skipped")) == report["summary"]["SKIP"] + report["summary"]["WARN"]


# --------------------------------------------------------------------------- figures and HTML
def test_every_figure_drawn_from_full_report(report):
    drawn = {d.name: d for d in draw_all(report)}
    assert set(drawn) == {f.name for f in FIGURES}
    for d in drawn.values():
        assert d.skipped is None, (d.name, d.skipped)
        assert d.png.startswith(b"\x89PNG\r\n\x1a\n")


def test_figures_skip_gracefully_when_data_missing(report):
    sparse = json.loads(json.dumps(report))
    sparse["results"] = [r for r in sparse["results"] if r["stage"] == "align"]
    sparse["results"][0]["value"] = {}  # alignment measured nothing (e.g. an ERROR)
    drawn = {d.name: d for d in draw_all(sparse)}
    assert drawn["align_gaps"].png is None and "'rows'" in drawn["align_gaps"].skipped
    assert drawn["grad_norms"].skipped == "stage 'grad' did not run"
    assert drawn["summary"].png is not None
    html = html_report.render(sparse)
    assert "not drawn: no align measurement with &#x27;rows&#x27;" in html


def test_figure_crash_does_not_sink_report(report):
    broken = json.loads(json.dumps(report))
    grad = next(r for r in broken["results"] if r["stage"] == "grad")
    grad["value"]["per_param"] = {"w": {"norm": "not a number"}}
    drawn = {d.name: d for d in draw_all(broken)}
    assert drawn["grad_norms"].png is None and drawn["grad_norms"].skipped


def test_html_scatter_title_names_the_ci_method_like_the_stage_figure(report, monkeypatch):
    import objdebug.report.figures

    seen = {}
    real = objdebug.report.figures.scatter_png

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(objdebug.report.figures, "scatter_png", spy)
    drawn = {d.name: d for d in draw_all(report)}
    assert drawn["loss_vs_score"].png is not None
    ci = next(r for r in report["results"] if r["stage"] == "correlate")["value"]["ci"]
    assert ci["method"] and seen["ci_method"] == ci["method"]


def test_out_dir_scatter_is_the_report_figure(report, tmp_path):
    # drawn once, in report/: a run's --out PNG has the same bytes as the HTML/Markdown figure
    from objdebug.report.figures import write_pngs

    written = write_pngs(report, tmp_path)
    assert written == {"correlate_scatter": str(tmp_path / "correlate_scatter.png")}
    drawn = {d.name: d for d in draw_all(report)}
    assert (tmp_path / "correlate_scatter.png").read_bytes() == drawn["loss_vs_score"].png
    sparse = dict(report, results=[r for r in report["results"] if r["stage"] != "correlate"])
    assert write_pngs(sparse, tmp_path / "none") == {} and not (tmp_path / "none").exists()


def _links(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]*)"', html)


def test_html_is_self_contained(report):
    html = html_report.render(report)
    ids = set(re.findall(r'id="([^"]+)"', html))
    for link in _links(html):
        assert link.startswith("data:image/png;base64,") or (link.startswith("#") and link[1:] in ids), link
    assert html.count("<img ") == len([d for d in draw_all(report) if d.png])
    assert "<script" not in html and "http://" not in html and "https://" not in html
    # user text is escaped, the run's configuration and versions are shown
    assert "&lt;b&gt;not html&lt;/b&gt;" in html and "<b>not html</b>" not in html
    assert "mindspore" in html and "objdebug.losses:MaskedCrossEntropy" in html
    assert html.index("What did not pass") < html.index('id="stage-align"')


def test_render_from_saved_json_is_identical(tmp_path, report):
    path = tmp_path / "r.json"
    json_report.write(synthetic_result(), str(path))
    loaded = json_report.load(str(path))
    assert html_report.render(loaded) == html_report.render(report)
    assert markdown.render(loaded) == markdown.render(report)
    assert junit.dumps(loaded) == junit.dumps(report)


def test_markdown_writes_figures_beside_it(tmp_path, report):
    md_path = Path(markdown.write(report, tmp_path / "md"))
    text = md_path.read_text(encoding="utf-8")
    refs = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert refs and all((md_path.parent / r).is_file() for r in refs)
    assert "OBJ105 \\| " not in text and "gives loss 5.52 instead of 0 \\| &lt;b>not html&lt;/b>" in text  # pipes escaped


# --------------------------------------------------------------------------- profiles and select/ignore
def test_shipped_profiles_extend_default_with_known_keys():
    from objdebug.pipeline.profile import load_profile

    default = load_profile("default").data
    for name in ("quick", "full", "ci-gate"):
        prof = load_profile(name)
        assert prof.name == name
        raw = __import__("tomllib").loads((ROOT / "checks" / f"{name}.toml").read_text())
        assert raw.pop("extends") == "default"
        for key, value in raw.items():
            if isinstance(value, dict):
                unknown = set(value) - set(default.get(key, {}))
                assert not unknown, f"{name}.toml [{key}] overrides keys default.toml lacks: {unknown}"
            else:
                assert key in default or key in ("name", "description"), (name, key)
    assert load_profile("ci-gate").fail_on_warn and load_profile("ci-gate").error_fails
    assert not load_profile("quick").fail_on_warn


@pytest.mark.parametrize("code,select,ignore,kept", [
    ("OBJ101", [], [], True),
    ("OBJ101", ["OBJ1"], [], True),
    ("OBJ201", ["OBJ1"], [], False),
    ("OBJ101", [], ["OBJ1"], False),
    ("OBJ101", ["OBJ101"], ["OBJ1"], True),     # the more specific entry wins
    ("OBJ105", ["OBJ1"], ["OBJ105"], False),
    ("OBJ105", ["OBJ10"], ["OBJ1"], True),
    ("OBJ105", ["OBJ1"], ["OBJ1"], True),       # a tie keeps the code
    ("OBJ001", ["OBJ1"], [], False),            # baseline findings obey --select too
])
def test_code_selected(code, select, ignore, kept):
    from objdebug.pipeline.profile import code_selected

    assert code_selected(code, select, ignore) is kept


# --------------------------------------------------------------------------- the CLI gate
def _invoke(args):
    from typer.testing import CliRunner

    from objdebug.cli import app

    return CliRunner().invoke(app, args, catch_exceptions=False)


@pytest.fixture(scope="module")
def healthy_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("healthy")
    res = _invoke(["run", "-c", str(TARGET / "objdebug.toml"), "-p", str(LENIENT), "--stages", "align",
                   "--json", str(out / "r.json"), "--junit", str(out / "r.xml"),
                   "--html", str(out / "html"), "--markdown", str(out / "md")])
    return res, out


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("broken")
    res = _invoke(["run", "-c", str(TARGET / "objdebug.toml"), "-p", str(LENIENT), "--stages", "align",
                   *BROKEN, "--json", str(out / "r.json"), "--junit", str(out / "r.xml"),
                   "--html", str(out / "html")])
    return res, out


def test_gate_passes_and_writes_every_report(healthy_run):
    res, out = healthy_run
    assert res.exit_code == 0, res.output
    rep = json_report.load(str(out / "r.json"))
    assert rep["passed"] and rep["compiles"]["count"] >= 1
    assert rep["compiles"]["count"] == sum(s["count"] for s in rep["compiles"]["by_stage"].values())
    root = ET.parse(out / "r.xml").getroot()
    assert root.get("failures") == "0" and root.get("errors") == "0" and int(root.get("tests")) == 5
    html = (out / "html" / "index.html").read_text(encoding="utf-8")
    assert "PASSED" in html and html.count("<img ") == 2  # summary + align gaps
    assert (out / "md" / "report.md").is_file() and (out / "md" / "fig-align_gaps.png").is_file()


def test_gate_fails_on_broken_objective_and_html_says_why(broken_run):
    res, out = broken_run
    assert res.exit_code == 1, res.output
    rep = json_report.load(str(out / "r.json"))
    masked = next(f for r in rep["results"] for f in r["findings"] if f["code"] == "OBJ105")
    assert masked["verdict"] == "FAIL" and masked["value"] > 1.0  # ~log(256) = 5.5 on a random model
    html = (out / "html" / "index.html").read_text(encoding="utf-8")
    assert "FAILED" in html and "What did not pass" in html
    assert "OBJ105" in html and "label_pad_id=0" in html and "fix: Make the objective" in html
    case = ET.parse(out / "r.xml").getroot().find(".//testcase[@name='OBJ105 label_pad_not_scored']")
    assert "label_pad_id=0" in case.find("failure").text


def test_render_reproduces_reports(tmp_path, broken_run):
    _, out = broken_run
    res = _invoke(["render", str(out / "r.json"), "--html", str(tmp_path / "html"),
                   "--junit", str(tmp_path / "r.xml")])
    assert res.exit_code == 0, res.output
    assert "FAILED" in res.output and "OBJ105" in res.output
    assert (tmp_path / "html" / "index.html").read_bytes() == (out / "html" / "index.html").read_bytes()
    assert (tmp_path / "r.xml").read_bytes() == (out / "r.xml").read_bytes()


def test_render_bad_input_exits_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{\"tool\": \"other\"}")
    res = _invoke(["render", str(bad), "--html", str(tmp_path / "h")])
    assert res.exit_code == 2 and "not an objdebug JSON report" in res.output


def test_ignore_flips_the_gate(tmp_path):
    """--ignore OBJ105 drops the only failing finding of the broken target: the gate passes."""
    res = _invoke(["run", "-c", str(TARGET / "objdebug.toml"), "-p", str(LENIENT), "--stages", "align",
                   *BROKEN, "--select", "OBJ10", "--ignore", "OBJ105", "--junit", str(tmp_path / "r.xml")])
    assert res.exit_code == 0, res.output
    codes = [c.get("name").split()[0] for c in ET.parse(tmp_path / "r.xml").getroot().iter("testcase")]
    assert codes == ["OBJ101", "OBJ102", "OBJ103", "OBJ104"]
