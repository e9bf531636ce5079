"""align: the objective's per-sample losses equal a numpy float64 reference of the same losses,
for a correct masked objective and for the classic ignore_index/label_pad_id mismatch."""

import math
from pathlib import Path

import numpy as np
import pytest

from objdebug import api
from objdebug.engine import runtime
from objdebug.core.config import load_config
from objdebug.engine.data import pack
from objdebug.engine.core import Engine
from objdebug.engine.target import load_target

from .conftest import TARGETS
from .conftest import settings

BROKEN = {"objective.factory": "mindspore.nn:CrossEntropyLoss",
          "objective.kwargs": {"ignore_index": -100}, "data.label_pad_id": 0}


def _log_softmax64(logits):
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def reference_losses(cfg, rows, engine):
    """float64 reference: mean CE over the positions the objective is expected to score, each
    sample right-padded to its engine bucket as the engine does (padding is scored when broken).
    `engine`: one whose buckets were planned from these rows (as in the run)."""
    out = {}
    for r in rows:
        for s in r["samples"].values():
            length = engine.bucket(s.length)
            ids, labels = pack([s] * engine.batch_size, length, cfg.data.pad_id,
                               cfg.data.label_pad_id, cfg.data.shift)
            logp = _log_softmax64(engine.logits(ids))[0]
            keep = labels[0] != -100  # nn.CrossEntropyLoss(ignore_index=-100) / MaskedCrossEntropy
            nll = -logp[np.arange(length), np.where(keep, labels[0], 0)]
            out[(r["id"], s.kind)] = float(nll[keep].mean())
    return out


def _rows(result):
    return next(r for r in result.results if r.check == "alignment").value["rows"]


@pytest.fixture(scope="module")
def tiny_runs():
    path = TARGETS / "tiny" / "objdebug.toml"
    good_cfg = load_config(path)
    bad_cfg = load_config(path, overrides=BROKEN)
    return good_cfg, api.run(good_cfg, stages=["align"]), bad_cfg, api.run(bad_cfg, stages=["align"])


def test_losses_match_numpy_reference(tiny_runs):
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.datasets import align_rows
    from objdebug.pipeline.profile import load_profile

    good_cfg, good, bad_cfg, bad = tiny_runs
    for cfg, result in ((good_cfg, good), (bad_cfg, bad)):
        runtime.setup("CPU", "graph", 0)
        target = load_target(cfg)
        ctx = Context(config=cfg, target=target, engine=Engine(target), profile=load_profile())
        # an align-only run on CPU scores rows through fused static graphs at its own lengths
        # (engine/row_scoring.py); the broken objective scores padding, so the length matters
        ctx.engine.static_rows = True
        rows = align_rows(ctx)  # plans the engine's buckets from the rows, as the run did
        ref = reference_losses(cfg, rows, ctx.engine)
        for row in _rows(result):
            for kind in ("good", "medium", "bad"):
                assert row[kind] == pytest.approx(ref[(row["id"], kind)], rel=1e-4, abs=1e-5), (cfg.data.label_pad_id, row["id"], kind)


def test_broken_config_dilutes_gap_as_predicted(tiny_runs):
    """With label_pad_id=0 every one of the T positions is scored: gap_broken = gap_resp * n/T
    plus the difference in what the shorter/longer padding tail contributes; at least, the
    broken gap is much smaller in magnitude than the response-only gap per row."""
    _, good, _, bad = tiny_runs
    g = {r["id"]: r for r in _rows(good)}
    b = {r["id"]: r for r in _rows(bad)}
    for rid in g:
        assert abs(b[rid]["gap"]) < abs(g[rid]["gap"])
    mask_good = next(r for r in good.results if r.check == "label-pad-masking")
    mask_bad = next(r for r in bad.results if r.check == "label-pad-masking")
    assert mask_good.findings[0].verdict.value == "PASS"
    assert mask_bad.findings[0].verdict.value == "FAIL"
    assert mask_bad.value["masked_loss"] > 1.0  # -log p(token 0) at every position
    assert "ignore_index must equal data.label_pad_id" in mask_bad.findings[0].message


def test_aggregates_and_verdicts_are_consistent(tiny_runs):
    _, good, _, _ = tiny_runs
    res = next(r for r in good.results if r.check == "alignment")
    v = res.value
    gaps = np.array([r["gap"] for r in v["rows"]])
    assert v["mean_gap"] == pytest.approx(gaps.mean())
    assert v["min_gap"] == pytest.approx(gaps.min())
    ordered = [r["bad"] > r["medium"] > r["good"] for r in v["rows"]]
    assert v["order_accuracy"] == pytest.approx(np.mean(ordered))
    assert sorted(v["violations"]) == sorted(r["id"] for r, o in zip(v["rows"], ordered) if not o)
    from scipy import stats

    assert v["p_wilcoxon"] == pytest.approx(stats.wilcoxon(gaps, alternative="greater").pvalue)
    # 7 rows >= min_rows 6, so the paired test is judged, not an ERROR
    sig = next(f for f in res.findings if f.code == "OBJ103")
    assert sig.verdict.value in ("PASS", "WARN", "FAIL", "INFO")  # INFO: judged, the random model excuses it (OBJ004)
    codes = [f.code for f in res.findings]
    assert codes == ["OBJ101", "OBJ102", "OBJ103", "OBJ104"]


def test_compile_budget_is_reported_per_check(tiny_runs):
    """Every compile is charged to the check (or the contract probe) whose call made it, with the
    graphs each check used: the probe compiles the model and, since align scores rows one by one,
    checks the objective through the per-sample graph align then reuses; nothing compiles twice.
    An align-only run on CPU: that is one fused static graph (model + the objective per row,
    engine/row_scoring.py), which the contract probe compiles and align reuses."""
    _, result, _, _ = tiny_runs
    comp = result.compiles
    by_check = comp["by_check"]
    assert sum(c["count"] for c in by_check.values()) == comp["count"]
    assert [g.split()[0] for g in by_check["contract"]["compiled"]] == ["objective.per_sample"]
    assert comp["holds_model"] == 1
    assert "alignment" not in by_check or not by_check["alignment"]["compiled"]
    assert by_check["alignment"]["uses"] == ["objective.per_sample"]
    for c in by_check.values():  # what a check compiled, it also used
        assert {g.split()[0] for g in c["compiled"]} <= set(c["uses"])
    graphs = [(g["graph"], g["shapes"]) for g in comp["graphs"]]
    assert len(graphs) == len(set(graphs))


def test_gap_conditions_from_profile():
    from objdebug.stages.align import AlignmentLoss

    conds = {c.code: c for c in AlignmentLoss().conditions(settings("align", gap_pass=1.5, gap_fail=0.1))}
    base = {"min_gap": 0.0, "min_gap_id": "x", "mean_loss": {}, "n_rows": 10}
    for gap, verdict in ((2.0, "PASS"), (1.5, "PASS"), (1.0, "WARN"), (0.1, "WARN"), (0.05, "FAIL"),
                         (float("nan"), "FAIL")):
        assert conds["OBJ101"].judge({**base, "mean_gap": gap})[0].value == verdict


def test_too_few_rows_is_error_not_pass():
    from objdebug.stages.align import AlignmentLoss

    cond = {c.code: c for c in AlignmentLoss().conditions(settings("align", min_rows=6))}["OBJ103"]
    verdict, message, _ = cond.judge({"n_rows": 3, "p_wilcoxon": 0.001, "p_ttest": 0.001})
    assert verdict.value == "ERROR" and "too few" in message


def test_synthesize_generates_counterparts(tmp_path):
    import json

    rows = [{"id": f"s{i}", "prompt": "say something:", "good": f" hello there number {i}."}
            for i in range(6)]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = load_config(TARGETS / "tiny" / "objdebug.toml",
                      overrides={"data.align": str(tmp_path / "a.jsonl")})
    result = api.run(cfg, stages=["align"], options={"synthesize": True})
    v = next(r for r in result.results if r.check == "alignment").value
    assert v["synthetic_rows"] == 6
    assert v["rows"][0]["synthetic"] == ["medium=shuffled", "bad=random", "repeat=repeat"]
    assert all(math.isfinite(r["repeat"]) for r in v["rows"])


def test_graph_compile_error_names_the_line_and_leaves_no_droppings(tmp_path, monkeypatch):
    """The contract probe compiles the objective before the stages: an input error (exit 2) naming
    the user's file:line, not an ERROR in every check (issue 9)."""
    from objdebug.core.errors import InputError

    monkeypatch.chdir(tmp_path)
    cfg = load_config(TARGETS / "tiny" / "objdebug.toml",
                      overrides={"objective.factory": "fixtures.core_objectives:ShapeBugLoss",
                                 "objective.kwargs": {}})
    with pytest.raises(InputError) as err:
        api.run(cfg, stages=["align"])
    assert "core_objectives.py:13: graph mode (mindspore.GRAPH_MODE) cannot compile" in str(err.value)
    assert not (Path(tmp_path) / "rank_0").exists()
    assert list(Path(tmp_path).iterdir()) == []


def test_end_to_end_form(tmp_path):
    cfg = load_config(TARGETS / "tiny" / "objdebug.toml",
                      overrides={"objective.factory": "fixtures.core_objectives:EndToEndLM",
                                 "objective.kwargs": {"d_model": 16}})
    cfg.model = None  # the objective owns its network
    result = api.run(cfg, stages=["align"])
    assert result.target["form"] == "end-to-end"
    v = next(r for r in result.results if r.check == "alignment").value
    assert all(math.isfinite(r["good"]) for r in v["rows"])


def test_compiles_are_counted_once_per_shape(tiny_runs):
    _, good, _, _ = tiny_runs
    graphs = [(g["graph"], g["shapes"]) for g in good.compiles["graphs"]]
    assert len(graphs) == len(set(graphs)) == good.compiles["count"]
    # one per-sample graph per planned length bucket serves all 21 answers and the masked probe:
    # the ladder would give two (32 and 64), one compile costs more than padding 21 short rows
    import json

    from objdebug.engine.data import bucket_length, choose_buckets

    rows = [json.loads(line) for line in open(TARGETS / "tiny" / "align.jsonl")]
    lengths = [len((r["prompt"] + r[k]).encode()) for r in rows for k in ("good", "medium", "bad")]
    assert {bucket_length(n) for n in lengths} == {32, 64}
    assert choose_buckets(lengths, 8) == (64,)
    # an align-only run compiles its own static lengths (engine/row_scoring.py: the longest row
    # rounded up to 16), one fused graph for every answer and the masked probe
    assert [g for g, _ in graphs] == ["objective.per_sample"]


def test_nonfinite_losses_fail_obj104():
    """A loss normalised by a zero count returns Inf on ordinary samples: OBJ104 names them."""
    cfg = load_config(TARGETS / "tiny" / "objdebug.toml",
                      overrides={"objective.factory": "fixtures.grad_losses:ZeroCountCE",
                                 "objective.kwargs": {}})
    result = api.run(cfg, stages=["align"])
    f = next(f for f in result.findings if f.code == "OBJ104")
    assert f.verdict.value == "FAIL" and f.value == 21.0  # 7 rows x good/medium/bad
    assert "21 non-finite losses" in f.message and "t1/good" in f.message


@pytest.mark.parametrize("accuracy, verdict", [(1.0, "PASS"), (0.8, "PASS"), (0.7, "WARN"),
                                               (0.5, "WARN"), (0.4, "FAIL")])
def test_order_conditions_from_profile(accuracy, verdict):
    from objdebug.stages.align import AlignmentLoss

    cond = {c.code: c for c in AlignmentLoss().conditions(settings("align"))}["OBJ102"]
    v = {"order_accuracy": accuracy, "pair_accuracy": 1.0, "violations": ["a", "b"]}
    assert cond.judge(v)[0].value == verdict


@pytest.mark.parametrize("p, verdict", [(0.001, "PASS"), (0.02, "WARN"), (0.05, "FAIL"), (0.5, "FAIL")])
def test_significance_conditions_from_profile(p, verdict):
    from objdebug.stages.align import AlignmentLoss

    cond = {c.code: c for c in AlignmentLoss().conditions(settings("align"))}["OBJ103"]
    assert cond.judge({"n_rows": 24, "p_wilcoxon": p, "p_ttest": p})[0].value == verdict


def test_without_align_data_the_stage_is_skipped_with_the_reason():
    cfg = load_config(TARGETS / "tiny" / "objdebug.toml", overrides={"data.align": ""})
    result = api.run(cfg, stages=["align"])
    assert {f.verdict.value for f in result.findings if f.code != "OBJ005"} == {"SKIP"}
    assert "set data.align" in result.findings[0].message
    assert result.exit_code == 1  # every check skipped: nothing was checked (OBJ005, issue 23)


def test_a_nan_on_a_fully_masked_sample_never_passes():
    """MindSpore's CrossEntropyLoss(ignore_index=-100) averages over zero positions on a fully
    masked sample: NaN. That used to print `PASS nan`; a NaN measurement is a WARN (issue 37)."""
    from objdebug.core.findings import Verdict
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.profile import load_profile
    from objdebug.pipeline.runner import run_check
    from objdebug.stages.align import LabelPadMasking

    cfg = load_config(TARGETS / "grad_ms_ce" / "objdebug.toml")
    runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
    target = load_target(cfg)
    ctx = Context(config=cfg, target=target, engine=Engine(target), profile=load_profile())
    res = run_check(LabelPadMasking(), ctx, settings("align"))
    assert res.error is None and math.isnan(res.value["masked_loss"])
    [f] = res.findings
    assert f.code == "OBJ105" and f.verdict is Verdict.WARN, (f.verdict, f.message)
    assert "gives NaN" in f.message and "cannot tell" in f.message
