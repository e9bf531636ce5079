"""Graphs shared across checks (objdebug/engine/core.py, engine/dynamic_graph.py): a graph that
raised is dropped and compiles again when called again (MindSpore 2.10 refuses every later call of
a graph that raised), and one dynamic-shape graph answers what one static graph per shape does."""

from __future__ import annotations

import numpy as np
import pytest

from objdebug.engine import dynamic_graph, runtime
from objdebug.engine.core import Engine
from objdebug.stages.stress._common import loss_and_grad, packed, text_sample

from .test_stress import Target

pytestmark = pytest.mark.mindspore_range  # what differs between releases: CI runs it on the oldest too


@pytest.fixture(scope="module")
def target():
    return Target("stress_healthy")


def test_a_graph_that_raised_compiles_again_when_called_again(target):
    import mindspore as ms
    from mindspore import nn

    class Lookup(nn.Cell):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(16, 4)

        def construct(self, x):
            return self.table(x).sum()

    engine = Engine(target.ctx.target)
    cell = engine.cell("lookup", Lookup)
    good = np.zeros((2, 8), np.int32)
    bad = good.copy()
    bad[0, 3] = 16  # out of the table: the kernel raises at run time
    with runtime.scratch_dir():
        first = float(engine.call("lookup", cell, ms.Tensor(good)).asnumpy())
        with pytest.raises(RuntimeError, match="Gather"):
            engine.call("lookup", cell, ms.Tensor(bad))
        again = float(engine.call("lookup", cell, ms.Tensor(good)).asnumpy())
    assert again == first
    assert [r.graph for r in engine.compiles.records] == ["lookup", "lookup"]  # compiled again, counted
    assert [r["graph"] for r in engine.compiles.retired] == ["lookup"]
    assert engine.called("lookup")
    assert engine.compiles.to_dict()["retired"][0]["graph"] == "lookup"


@pytest.mark.slow
def test_the_shared_vjp_gradient_equals_the_fused_static_graph_per_shape(target):
    """The split form's parameter gradient through the shared graphs (model.forward ->
    objective.logit_grad -> model.vjp, one compile each for every length) equals the fused
    model + objective forward + backward compiled per shape (engine/gradients.py)."""
    ctx = target.ctx
    engine = Engine(ctx.target)
    ctx2 = type(ctx)(config=ctx.config, target=ctx.target, engine=engine, profile=ctx.profile)
    sample = text_sample(ctx2, 40, "pad")
    with runtime.scratch_dir():
        dyn = [loss_and_grad(ctx2, *packed(ctx2, [sample], t)) for t in (40, 90)]
        static = [loss_and_grad(ctx2, *packed(ctx2, [sample], t), static=True) for t in (40, 90)]
    graphs = [(r.graph, r.shapes) for r in engine.compiles.records]
    shared = [g for g, shapes in graphs if shapes == ""]
    assert sorted(shared) == ["model.forward", "model.vjp", "objective.logit_grad"]  # one compile for both lengths
    assert [g for g, _ in graphs if g.startswith("objective.param_grad")] == ["objective.param_grad.static"] * 2
    assert sum(r.holds_model for r in engine.compiles.records) == 4  # forward, VJP, two fused statics
    for d, s in zip(dyn, static):
        assert d["loss"] == pytest.approx(s["loss"], rel=1e-6)
        for a, b in zip(d["grads"], s["grads"]):
            np.testing.assert_allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-7)


def test_a_graph_that_cannot_compile_dynamically_runs_static(target, monkeypatch):
    import mindspore as ms

    from objdebug.engine.gradients import ObjectiveLogitGrad

    def wrong_rank(self, *inputs):  # a dynamic declaration the graph cannot compile with
        real(self, ms.Tensor(shape=[None], dtype=ms.float32), *inputs[1:])

    real = ObjectiveLogitGrad.set_inputs
    monkeypatch.setattr(ObjectiveLogitGrad, "set_inputs", wrong_rank)
    engine = Engine(target.ctx.target)
    x = np.random.default_rng(0).normal(size=(2, 6, 256)).astype(np.float32)
    y = np.full((2, 6), 3, np.int32)
    with runtime.scratch_dir():
        from objdebug.engine.gradients import objective_logit_grad

        args = lambda: (ms.Tensor(x), ms.Tensor(y), ms.Tensor(np.float32(1.0)))  # noqa: E731
        out1, _ = objective_logit_grad(engine, target.ctx.target.objective, False, *args())
        out2, _ = objective_logit_grad(engine, target.ctx.target.objective, False, *args())
    assert "objective.logit_grad" in engine.static_fallbacks
    assert [r.graph for r in engine.compiles.records] == ["objective.logit_grad.static"]
    assert float(out1.asnumpy()[0]) == float(out2.asnumpy()[0])
    assert dynamic_graph.STATIC_SUFFIX == ".static"


def test_a_signal_turned_into_an_error_during_the_first_call_is_no_fallback(target, monkeypatch):
    """^C during a dynamic graph's compile reaches Python as MindSpore's error: it must stop the
    run (Interrupted), not be taken for a graph that cannot compile dynamically."""
    import signal

    from objdebug.core import interrupts

    engine = Engine(target.ctx.target)

    def interrupted_compile(name, fn, *args, **kw):
        monkeypatch.setitem(interrupts._hold, "fired", signal.SIGINT)  # the handler ran ...
        raise RuntimeError("Failed to compile: KeyboardInterrupt")  # ... and MindSpore caught it

    import mindspore as ms
    from mindspore import nn

    class Twice(nn.Cell):
        def construct(self, x):
            return x * 2

    monkeypatch.setattr(engine, "call", interrupted_compile)
    with pytest.raises(interrupts.Interrupted):
        dynamic_graph.call(engine, "g", Twice, (ms.Tensor(shape=[None], dtype=ms.float32),),
                           ms.Tensor(np.ones(3, np.float32)))
    assert "g" not in engine.static_fallbacks


def test_a_graph_holds_the_model_by_the_size_of_its_parameters(target):
    """`holds_model`: the model (or a Cell around it, or a second copy of it: the preference
    reference) holds the model; the objective alone, or a Cell with a small parameter of its own,
    does not. The compile log counts both in the report."""
    import mindspore as ms
    from mindspore import Parameter, nn

    from objdebug.engine.cells import ModelForward
    from objdebug.engine.core import CompileLog, CompileRecord

    from objdebug.engine.target import _call_factory

    ctx = target.ctx
    engine = Engine(ctx.target)
    model = ctx.target.model
    cfg = ctx.config
    second = _call_factory(cfg.model.factory, cfg.model.kwargs, "model", cfg.base_dir)  # the reference's way

    class Weighted(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = Parameter(ms.Tensor(np.ones(3, np.float32)), name="w")

    assert engine.holds_model(model) and engine.holds_model(ModelForward(model))
    assert not engine.holds_model(ctx.target.objective) and not engine.holds_model(Weighted())
    assert not engine.holds_model(lambda x: x)
    assert engine.holds_model(second)  # other Parameter objects, the same size
    log = CompileLog([CompileRecord("model.forward", "", 1.0, "setup", holds_model=True),
                      CompileRecord("objective.forward", "", 0.5, "setup")])
    d = log.to_dict()
    assert (d["count"], d["holds_model"]) == (2, 1)
    assert d["by_stage"]["setup"]["holds_model"] == 1
