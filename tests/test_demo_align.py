"""The bundled demo target: align passes; the classic masking bug is caught and explained, and
every per-sample loss equals a numpy float64 reference of the same loss."""

import pytest

from objdebug import api
from objdebug.core.config import load_config

from .test_align import BROKEN, _rows, reference_losses

pytestmark = pytest.mark.mindspore_range  # what differs between releases: CI runs it on the oldest too


@pytest.fixture(scope="module")
def demo_runs():
    good_cfg = load_config(demo=True)
    bad_cfg = load_config(demo=True, overrides=BROKEN)
    return good_cfg, api.run(good_cfg, stages=["align"]), bad_cfg, api.run(bad_cfg, stages=["align"])


def test_demo_align_passes(demo_runs):
    _, good, _, _ = demo_runs
    assert good.exit_code == 0, [f.message for f in good.findings]
    v = next(r for r in good.results if r.check == "alignment").value
    assert v["n_rows"] == 24
    assert v["mean_gap"] > 3.0
    assert v["order_accuracy"] >= 0.85


def test_demo_broken_masking_is_caught_and_explained(demo_runs):
    _, good, _, bad = demo_runs
    g = next(r for r in good.results if r.check == "alignment").value
    b = next(r for r in bad.results if r.check == "alignment").value
    # prompt and padding positions are scored: the gap is diluted to a fraction of itself
    assert b["mean_gap"] < 0.5 * g["mean_gap"]
    mask = next(r for r in bad.results if r.check == "label-pad-masking")
    assert mask.findings[0].verdict.value == "FAIL" and mask.findings[0].code == "OBJ105"
    assert "label_pad_id=0" in mask.findings[0].message
    assert bad.exit_code == 1


def test_demo_losses_match_numpy_reference(demo_runs):
    from objdebug.engine import runtime
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.datasets import align_rows
    from objdebug.engine.core import Engine
    from objdebug.pipeline.profile import load_profile
    from objdebug.engine.target import load_target

    for cfg, result in demo_runs[0:2], demo_runs[2:4]:
        runtime.setup("CPU", "graph", 0)
        target = load_target(cfg)
        engine = Engine(target)
        rows = align_rows(Context(config=cfg, target=target, engine=engine,
                                  profile=load_profile()))  # plans the buckets, as the run did
        ref = reference_losses(cfg, rows[:6], engine)
        for row in _rows(result)[:6]:
            for kind in ("good", "medium", "bad"):
                assert row[kind] == pytest.approx(ref[(row["id"], kind)], rel=1e-4, abs=1e-5)
