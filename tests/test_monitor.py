"""Training-time monitor: gradient statistics against numpy, the log's rules and `objdebug monitor-log`,
a functional loop (overhead measured), and the Callback in a real Model.train on the demo model."""

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from objdebug import monitor
from objdebug.cli import app
from objdebug.core.errors import InputError
from objdebug.core.findings import Verdict

runner = CliRunner()


# --------------------------------------------------------------------------- statistics and rules
def test_grad_stats_match_numpy():
    # reduced as the grad stage reduces them (on the host for gradients this small; float32 in
    # the graph for large ones, tests/test_engine_batching.py): float32 tolerance
    rng = np.random.default_rng(0)
    names = ["embed.weight", "blocks.0.attn.w", "blocks.0.attn.b", "blocks.1.mlp.w", "head.w", "gate"]
    grads = [rng.normal(size=(4, 3)), rng.normal(size=(3, 3)) * 10, rng.normal(size=3),
             rng.normal(size=(2, 2)), np.zeros((3, 2)), np.array([1.0, np.nan, np.inf])]
    s = monitor.grad_stats(names, grads)
    finite = [np.where(np.isfinite(g), g, 0.0) for g in grads]
    norms = np.array([np.linalg.norm(g) for g in finite])
    assert s["global_norm"] == pytest.approx(np.sqrt(np.sum(norms ** 2)), rel=1e-6)
    mats = norms[[0, 1, 3, 4]]                                    # ndim >= 2 only
    assert s["max_mean_ratio"] == pytest.approx(mats.max() / mats.mean(), rel=1e-6)
    assert s["max_mean_ratio_all"] == pytest.approx(norms.max() / norms.mean(), rel=1e-6)
    assert s["max_param"] == "blocks.0.attn.w"
    assert s["nonfinite"] == 2 and s["nonfinite_params"] == ["gate"]
    assert s["zero_params"] == ["head.w"]
    assert s["layers"]["blocks.0"] == pytest.approx(np.sqrt(norms[1] ** 2 + norms[2] ** 2), rel=1e-6)
    assert set(s["layers"]) == {"embed", "blocks.0", "blocks.1", "head", "gate"}


def write_log(path, steps, components=("ce", "aux"), **th):
    mon = monitor.TrainingMonitor(path, components, every=1, thresholds=th or None)
    for loss, comps, grads in steps:
        mon.step(loss, comps, grads, [type("P", (), {"name": f"p{i}.weight"}) for i in range(len(grads or []))])
    mon.close()
    return mon


def test_log_rules_and_report_exit_codes(tmp_path):
    ok_grads = [np.ones((2, 2)), np.ones((2, 2)) * 2]
    healthy = tmp_path / "healthy.jsonl"
    mon = write_log(healthy, [(3.0 - 0.1 * i, [2.5, 0.5 - 0.01 * i], ok_grads) for i in range(12)])
    assert all(f.verdict in (Verdict.PASS, Verdict.SKIP) for f in mon.summary())
    res = runner.invoke(app, ["monitor-log", str(healthy)])
    assert res.exit_code == 0, res.output
    assert "OBJ601" in res.output and "PASSED" in res.output

    # a dead aux term (exactly 0 from the start), a NaN loss at step 7, exploding ratio, zero grads
    broken = tmp_path / "broken.jsonl"
    grads = [np.full((2, 2), 50.0)] + [np.full((2, 2), 5e-4)] * 11 + [np.zeros((2, 2))]
    steps = [(float("nan") if i == 6 else 2.0, [2.0, 0.0], grads) for i in range(12)]
    write_log(broken, steps, dead_steps=5)
    rep = monitor.report(str(broken))
    v = {f.code: f for f in rep["findings"]}
    assert v["OBJ601"].verdict is Verdict.FAIL and "step 7" in v["OBJ601"].message
    assert v["OBJ301"].verdict is Verdict.FAIL and "'aux'" in v["OBJ301"].message
    norms = np.array([100.0] + [1e-3] * 11 + [0.0])               # Frobenius norms of the grads
    assert v["OBJ603"].value == pytest.approx(norms.max() / norms.mean(), rel=1e-9)
    assert v["OBJ603"].verdict is Verdict.WARN                    # 13.0: warn > 10, fail > 15
    assert v["OBJ604"].verdict is Verdict.WARN and "p12.weight" in v["OBJ604"].message
    assert v["OBJ303"].verdict is Verdict.PASS                    # a dead term is not a scale problem
    # live findings are in the step records, with the same codes
    lines = [json.loads(x) for x in broken.read_text().splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["schema"] == monitor.SCHEMA
    assert lines[0]["thresholds"]["dead_steps"] == 5
    assert {f["code"] for f in lines[5]["findings"]} >= {"OBJ301"}   # 5th zero step
    assert lines[7]["loss"] == "NaN" and lines[-1]["type"] == "end"
    res = runner.invoke(app, ["monitor-log", str(broken)])
    assert res.exit_code == 1
    assert "FAIL OBJ601" in res.output and "FAIL OBJ301" in res.output and "fix:" in res.output

    # the old name still works, hidden, with one line on stderr pointing to the new one
    old = runner.invoke(app, ["report", str(broken)])
    assert old.exit_code == 1 and old.stdout == res.stdout
    assert old.stderr.strip().splitlines() == [
        "objdebug: 'objdebug report' is deprecated; use 'objdebug monitor-log'."]
    listed = [line.strip("│ ").split(" ")[0] for line in runner.invoke(app, ["--help"]).output.splitlines()]
    assert "monitor-log" in listed and "report" not in listed


def test_ratio_and_scale_thresholds(tmp_path):
    path = tmp_path / "scale.jsonl"
    write_log(path, [(1.0, [1.0, 1e-4], [np.eye(2), np.eye(2) * 1e3] + [np.eye(2) * 1e-3] * 30)
                     for _ in range(3)])
    v = {f.code: f for f in monitor.report(str(path))["findings"]}
    assert v["OBJ303"].verdict is Verdict.FAIL and v["OBJ303"].value == pytest.approx(1e4, rel=1e-9)
    norms = np.array([math.sqrt(2), math.sqrt(2) * 1e3] + [math.sqrt(2) * 1e-3] * 30)
    assert v["OBJ603"].value == pytest.approx(norms.max() / norms.mean(), rel=1e-9)
    assert v["OBJ603"].verdict is Verdict.FAIL                    # 32 > ratio_fail 15


@pytest.mark.parametrize("text,line", [
    ("not json\n", 1),
    ('{"type": "header", "schema": "other/9"}\n', 1),
    ('{"type": "header", "schema": "objdebug.monitor/1", "components": []}\n{"type": "step", "loss": 1.0}\n', 2),
    ('{"type": "header", "schema": "objdebug.monitor/1", "components": []}\n{"type": "step", "step": 1, '
     '"loss": 1.0}\n{"type": "step", "step": 2, "loss": "x"}\n', 3),
])
def test_malformed_log_names_the_line(tmp_path, text, line):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(InputError) as exc:
        monitor.load_log(str(path))
    assert exc.value.line == line
    res = runner.invoke(app, ["monitor-log", str(path)])
    assert res.exit_code == 2 and f"bad.jsonl:{line}:" in res.output


def test_layer_of_is_one_definition_for_grad_stage_and_monitor():
    from objdebug.core import naming
    from objdebug.monitor import quantities

    assert quantities.layer_of is naming.layer_of
    assert quantities.layer_of("model.layers.11.mlp.w") == "model.layers.11"  # was 'model' here
    s = monitor.grad_stats(["model.layers.0.w", "model.layers.1.w"], [np.ones((2, 2))] * 2)
    assert set(s["layers"]) == {"model.layers.0", "model.layers.1"}


def _header_line():
    return '{"type": "header", "schema": "objdebug.monitor/1", "components": []}\n'


@pytest.mark.parametrize("make,line", [
    (lambda p: p.mkdir(), None),                                            # a folder
    (lambda p: p.write_bytes(_header_line().encode() + b'{"type": "step", "step": 1, "loss": 1.0}\n'
                             b'\xff\xfe\n'), 3),                        # not UTF-8
    (lambda p: p.write_text(_header_line() + '{"type": "step", "step": 1, "loss": 1.0, "grad": '
                            '{"global_norm": 1.0, "mean_norm": 1.0, "max_norm": 1.0, "max_mean_ratio": 1.0, '
                            '"nonfinite": 0, "zero_params": [], "n_params": 2}}\n'), 2),  # no max_param
    (lambda p: p.write_text(_header_line() + '{"type": "step", "step": 1, "loss": 1.0, "findings": 3}\n'), 2),
])
def test_unreadable_log_or_incomplete_record_is_an_input_error(tmp_path, make, line):
    path = tmp_path / "bad.jsonl"
    make(path)
    with pytest.raises(InputError) as exc:
        monitor.load_log(str(path))
    assert exc.value.line == line
    res = runner.invoke(app, ["monitor-log", str(path)])
    assert res.exit_code == 2, res.output
    assert ("bad.jsonl:" + (f"{line}:" if line else "")) in res.output


# --------------------------------------------------------------------------- with MindSpore
@pytest.fixture(scope="module")
def ms_graph():
    from objdebug.engine import runtime

    runtime.setup("CPU", "graph", 0)


def _train_step(net, objective):
    """A functional loop's step: value_and_grad with has_aux + Adam, compiled once."""
    import mindspore as ms
    from mindspore import nn

    class Loss(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.net, self.objective = net, objective

        def construct(self, ids, labels):
            logits = self.net(ids)
            r = self.objective(logits.reshape((-1, logits.shape[-1])), labels.reshape((-1,)))
            return r

    opt = nn.Adam(net.trainable_params(), 1e-3)

    class Step(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.opt = opt
            self.grad = ms.value_and_grad(Loss(), None, opt.parameters, has_aux=True)

        def construct(self, ids, labels):
            out, grads = self.grad(ids, labels)
            self.opt(grads)
            return out, grads

    return Step(), opt.parameters


def _batches(n, batch=4, length=32, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 200, (n, batch, length)).astype(np.int32)
    labels = np.roll(ids, -1, axis=2)
    labels[:, :, -1] = -100
    return ids, labels


@pytest.mark.slow
def test_functional_loop_overhead_and_stop(tmp_path, ms_graph):
    import mindspore as ms

    from fixtures.decompose_losses import DeadFactTerm, HealthyComposite
    from objdebug.demo.model import build_model

    ids, labels = _batches(21)
    step, params = _train_step(build_model(d_model=16, n_layers=1, n_heads=2), HealthyComposite())
    step(ms.Tensor(ids[0]), ms.Tensor(labels[0]))                 # compile once, outside the timing

    t = time.perf_counter()
    for i in range(1, 21):
        out, _ = step(ms.Tensor(ids[i]), ms.Tensor(labels[i]))
    float(out[0].asnumpy())
    plain = time.perf_counter() - t

    path = tmp_path / "run.jsonl"
    t = time.perf_counter()
    with monitor.TrainingMonitor(path, ["ce", "entropy", "z_loss"], every=5) as mon:
        for i in range(1, 21):
            out, grads = step(ms.Tensor(ids[i]), ms.Tensor(labels[i]))
            mon.step(out[0], out[1:], grads, params)
    monitored = time.perf_counter() - t
    print(f"\nmonitor overhead, 20 steps (tiny LM, every=5): plain {plain / 20 * 1e3:.1f} ms/step, "
          f"monitored {monitored / 20 * 1e3:.1f} ms/step ({monitored / plain:.2f}x)")
    rep = monitor.report(str(path))
    assert rep["exit_code"] == 0, monitor.render_report(rep)
    assert len(rep["records"]) == 20 and [r["step"] for r in rep["records"] if "grad" in r] == [1, 5, 10, 15, 20]
    first = rep["records"][0]
    assert first["components"]["ce"] == pytest.approx(first["loss"] - first["components"]["entropy"]
                                                      - first["components"]["z_loss"], rel=1e-5)
    assert first["grad"]["n_params"] == len(params)

    # a dead term with stop_on_fail: the helper raises at the dead_steps-th zero step
    step, params = _train_step(build_model(d_model=16, n_layers=1, n_heads=2), DeadFactTerm())
    path = tmp_path / "dead.jsonl"
    mon = monitor.TrainingMonitor(path, ["ce", "fact"], every=5, stop_on_fail=True, thresholds={"dead_steps": 3})
    with pytest.raises(monitor.TrainingStopped, match="OBJ301"):
        for i in range(20):
            out, grads = step(ms.Tensor(ids[i]), ms.Tensor(labels[i]))
            mon.step(out[0], out[1:], grads, params)
    assert mon.steps == 3 and mon.closed
    end = json.loads(path.read_text().splitlines()[-1])
    assert end["type"] == "end" and end["stopped"] and end["reason"] == "stop_on_fail: OBJ301"


def test_callback_in_model_train_on_demo_model(tmp_path, ms_graph):
    """Model.train on the demo model (its checkpoint, else random init) with a composite loss whose fact term never
    fires: the callback logs every step, computes gradients every 2 steps on the step's batch,
    and stops training when the dead term is detected; `objdebug monitor-log` renders the log."""
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Model

    import objdebug.demo
    from fixtures.decompose_losses import DeadFactTerm
    from objdebug.demo.model import build_model
    from objdebug.engine.target import load_checkpoint_strict

    net = build_model()                               # the demo target's model ...
    ckpt = Path(objdebug.demo.__file__).parent / "demo.ckpt"
    if ckpt.is_file():                                # ... trained, when the checkpoint is there
        load_checkpoint_strict(net, str(ckpt), "model")

    class Composite(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.net, self.loss = net, DeadFactTerm()

        def construct(self, ids, labels):
            logits = self.net(ids)
            return self.loss(logits.reshape((-1, logits.shape[-1])), labels.reshape((-1,)))

    class TotalOnly(nn.Cell):                         # TrainOneStepCell needs a scalar loss
        def __init__(self, composite):
            super().__init__(auto_prefix=False)
            self.composite = composite

        def construct(self, ids, labels):
            return self.composite(ids, labels)[0]

    composite = Composite()
    ids, labels = _batches(1, batch=24, length=32)
    data = ds.NumpySlicesDataset({"ids": ids[0], "labels": labels[0]}, shuffle=False).batch(3)  # 8 steps
    model = Model(nn.TrainOneStepCell(TotalOnly(composite), nn.Adam(net.trainable_params(), 1e-3)))
    path = tmp_path / "train.jsonl"
    cb = monitor.MonitorCallback(path, ["ce", "fact_consistency"], every=2, stop_on_fail=True,
                                 loss_net=composite, thresholds={"dead_steps": 2})
    t = time.perf_counter()
    model.train(1, data, callbacks=[cb], dataset_sink_mode=False)
    print(f"\nModel.train with MonitorCallback: {time.perf_counter() - t:.1f} s for {cb.monitor.steps} steps")
    # components come from the gradient recompute at steps 1, 2: the 2nd zero step fails OBJ301
    assert cb.monitor.steps == 2 and cb.monitor.should_stop
    rep = monitor.report(str(path))
    recs = rep["records"]
    assert [r["step"] for r in recs] == [1, 2] and all("grad" in r for r in recs)
    assert recs[0]["grad"]["n_params"] == len(net.trainable_params())
    # training stopped after step 2, whose gradients were taken after its update: the weights now
    # are those the callback saw, so its components must equal the composite on step 2's batch
    import mindspore as ms

    ref = composite(ms.Tensor(ids[0][3:6]), ms.Tensor(labels[0][3:6]))
    assert recs[1]["components"]["ce"] == pytest.approx(float(ref[1].asnumpy()), rel=1e-5)
    assert recs[1]["components"]["fact_consistency"] == 0.0
    assert recs[0]["grad"]["max_mean_ratio"] < 10                  # a healthy model passes OBJ603
    res = runner.invoke(app, ["monitor-log", str(path)])
    assert res.exit_code == 1, res.output
    assert "FAIL OBJ301" in res.output and "fact_consistency" in res.output and "stopped" in res.output


def test_callback_differentiates_only_the_first_output_without_components(tmp_path, ms_graph):
    """A loss network returning (loss, extra) with no components named: d loss, not d (loss + extra)."""
    from types import SimpleNamespace

    import mindspore as ms
    from mindspore import nn

    class TwoOutputs(nn.Cell):
        def __init__(self):
            super().__init__()
            self.w = ms.Parameter(ms.Tensor(np.ones(3, np.float32)), name="w")

        def construct(self, x):
            return (self.w * x).sum(), 100.0 * self.w.sum()

    cb = monitor.MonitorCallback(tmp_path / "log.jsonl", loss_net=TwoOutputs())
    x = np.array([1.0, 2.0, 3.0], np.float32)
    grads, params, _, stats = cb._gradients(SimpleNamespace(train_network=None, train_dataset_element=[x]))
    np.testing.assert_allclose(grads[0].asnumpy(), x)  # the sum would give x + 100
    assert stats["finite_sq"] == pytest.approx([(x.astype(np.float64) ** 2).sum()])  # reduced in graph
    assert [p.name for p in params] == ["w"]
    grads, _, _, _ = cb._gradients(SimpleNamespace(train_network=None, train_dataset_element=[x]))
    np.testing.assert_allclose(grads[0].asnumpy(), x)
    cb.monitor.close()
