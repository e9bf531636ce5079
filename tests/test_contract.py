"""The target contract, probed before the stages: exit 2 and one line that says what the contract
expects and what came back; graph-compile failures name the user's file:line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .conftest import cli_exit_2
from typer.testing import CliRunner

from objdebug.engine.compile_errors import compile_error
from objdebug.pipeline import contract
from objdebug.core.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "fixtures" / "contract_targets.py"
runner = CliRunner()



def _tensor(shape, dtype=np.float32):
    import mindspore as ms

    return ms.Tensor(np.zeros(shape, dtype))


# --------------------------------------------------------------------------- unit: what came back
@pytest.mark.parametrize("out, components, needle", [
    ("per_token", [], "but got a tensor of shape [256] (Float32) (reduction='none'?"),
    ("dict", [], "but got a dict with keys ['loss']"),
    ("pair", [], "tuple of 2 (total + 1 component), so the config must name 1 component, but got 0"),
    ("pair", ["a", "b"], "but got 2: ['a', 'b']"),
    ("pair_of_vectors", ["a"], "but got a tuple of 2"),
])
def test_objective_outputs_that_break_the_contract(out, components, needle):
    value = {"per_token": lambda: _tensor((256,)), "dict": lambda: {"loss": _tensor(())},
             "pair": lambda: (_tensor(()), _tensor(())),
             "pair_of_vectors": lambda: (_tensor((4,)), _tensor((4,)))}[out]()
    with pytest.raises(InputError) as exc:
        contract._check_objective(value, components, "call = 'flat'")
    assert needle in str(exc.value)
    assert "must return a scalar loss, or a tuple" in str(exc.value) or "objective.components" in str(exc.value)


def test_objective_outputs_that_keep_the_contract():
    contract._check_objective(_tensor(()), [], "flat")
    contract._check_objective(_tensor((1,)), [], "flat")
    contract._check_objective((_tensor(()), _tensor(()), _tensor((1,))), ["a", "b"], "flat")


@pytest.mark.parametrize("value, needle", [
    (lambda: _tensor((256, 256)), "but got shape [256, 256]"),
    (lambda: (_tensor((8, 32, 16)), _tensor((8, 32, 4))), "but got a tuple of 2"),
    (lambda: _tensor((8, 32, 16), np.int32), "but got dtype Int32"),
    (lambda: _tensor((8, 16, 16)), "but got shape [8, 16, 16]"),
])
def test_logits_that_break_the_contract(value, needle):
    with pytest.raises(InputError) as exc:
        contract._check_logits(value(), 8, 32)
    assert "must return float logits [B, T, V] = [8, 32, V]" in str(exc.value)
    assert needle in str(exc.value)


MATMUL_ERROR = f"""For 'MatMulExt' op, shape1[-1] must be equal to shape2[-2], but got 256 and 3.

----------------------------------------------------
- The Traceback of Net Construct Code:
----------------------------------------------------
# 0 In file {ROOT}/objdebug/engine/cells.py:118, 19~83
            return call_on_logits(self.objective, self.flat, x, labels)
# 1 In file /home/u/proj/losses.py:126, 16~42
        extra = ops.matmul(logits, self.w).sum()
# 2 In file /venv/lib/python3.11/site-packages/mindspore/ops/function/math_func.py:8724, 11~49
    return auto_generate.matmul_ext(input, other)
 (See file '/tmp/objdebug-x/rank_0/om/analyze_fail.ir' for more details.)"""


def test_compile_error_names_the_users_frame():
    err = compile_error(RuntimeError(MATMUL_ERROR))
    assert str(err).startswith("/home/u/proj/losses.py:126: graph mode (mindspore.GRAPH_MODE) "
                               "cannot compile the target: For 'MatMulExt' op")
    assert "analyze_fail" not in str(err) and err.detail == MATMUL_ERROR
    assert compile_error(RuntimeError("For 'GatherD', index out of range")) is None


def test_max_positions_from_config_or_model(tiny_target):
    from objdebug.core.config import load_config
    from objdebug.engine.target import load_target

    from fixtures.contract_targets import PositionalLM

    cfg = load_config(tiny_target / "objdebug.toml")
    target = load_target(cfg)
    assert contract.max_positions(target) is None  # sinusoidal positions: no limit named
    target.model = PositionalLM(max_positions=48)
    assert contract.max_positions(target) == 48
    cfg.data.max_length = 20
    assert contract.max_positions(target) == 20


def test_probe_length_is_the_first_real_batch_bucket(tiny_target):
    """The probe's model.forward runs at the gradient batch's shape: the bucket its rows (the first
    batch_size) get under the plan of all rows, so the stages reuse its graph; the smallest bucket
    when a row is longer than the model takes."""
    from objdebug.core.config import load_config
    from objdebug.engine.core import Engine
    from objdebug.engine.data import choose_buckets
    from objdebug.engine.target import load_target

    rows = [json.loads(x) for x in (tiny_target / "align.jsonl").read_text().splitlines()]
    every = [len((r["prompt"] + r[k]).encode()) for r in rows for k in ("good", "medium", "bad") if k in r]
    longest = max(len((r["prompt"] + r["good"]).encode()) for r in rows[:8])  # byte tokens
    planned = min(b for b in choose_buckets(every, 8) if b >= longest)
    engine = Engine(load_target(load_config(tiny_target / "objdebug.toml")), batch_size=8)
    assert contract.probe_length(engine.target, engine) == planned > engine.bucket(1)
    engine.max_length = max(every) - 1  # the data errors are named later, where the rows are loaded
    assert contract.probe_length(engine.target, engine) == engine.bucket(1)
    (tiny_target / "align.jsonl").write_text("not json\n")
    engine.max_length = None
    assert contract.probe_length(engine.target, engine) == engine.bucket(1)


def test_probe_length_follows_the_plan_not_the_first_rows(tiny_target):
    """Short first rows, long later ones, one bucket planned for all: the probe runs at that
    bucket (the one align and grad then use), not at the first rows' own smaller bucket."""
    from objdebug.core.config import load_config
    from objdebug.engine.core import Engine
    from objdebug.engine.data import bucket_length, choose_buckets
    from objdebug.engine.target import load_target

    short = [{"id": f"s{i}", "prompt": "q", "good": "a" * 20, "medium": "b" * 20, "bad": "c" * 20}
             for i in range(8)]
    long = [{"id": f"l{i}", "prompt": "q", "good": "a" * 150, "medium": "b" * 150, "bad": "c" * 150}
            for i in range(8)]
    (tiny_target / "align.jsonl").write_text("".join(json.dumps(r) + "\n" for r in short + long))
    plan = choose_buckets([21] * 24 + [151] * 24, 8)
    assert plan == (256,) and bucket_length(21) < 256  # the case: one graph serves every row
    engine = Engine(load_target(load_config(tiny_target / "objdebug.toml")), batch_size=8)
    assert contract.probe_length(engine.target, engine) == 256


# --------------------------------------------------------------------------- real runs
def test_model_returning_a_tuple(tiny_target):
    # a tuple is scored by its first element (issue 14, tests/test_model_inputs.py); an index
    # past its end is one line
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml",
            "--set", "model.factory='fixtures.contract_targets:build_tuple_model'",
            "--set", "model.checkpoint=''", "--set", "model.output=2"],
           "For 'model.output', the index must be in [0, 2) (the model returns a tuple of 2",
           "but got 2.")


@pytest.mark.parametrize("objective, statement, reason", [
    ("TryCE", "try:", "Unsupported statement 'Try'"),
    ("TensorIfLogitsCE", "if logits > 100:", "Only tensor which shape is () or (1,) can be converted to bool"),
])
def test_construct_graph_mode_rejects_names_file_and_line(tiny_target, objective, statement, reason):
    line = next(i for i, text in enumerate(FIXTURE.read_text().splitlines(), 1)
                if text.strip() == statement)
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml",
            "--set", f"objective.factory='fixtures.contract_targets:{objective}'",
            "--set", "objective.kwargs={}"],
           f"{FIXTURE}:{line}: graph mode (mindspore.GRAPH_MODE) cannot compile the target: {reason}")


def test_objective_that_fails_on_one_row_is_named_before_the_stages(tiny_target):
    """align scores rows one by one, so the probe checks the objective through that per-sample
    graph; an objective that works only on a whole batch is exit 2 with both facts, not an ERROR
    in every check that scores rows."""
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml",
                "--set", "objective.factory='fixtures.contract_targets:WholeBatchCE'",
                "--set", "objective.kwargs={}"],
               "returns a tensor of shape [] (Float32) on a [8, ",
               "but fails when objdebug calls it on one row at a time, as the stages that score rows do",
               "WholeBatchCE needs the whole batch")


@pytest.mark.parametrize("stages, graphs", [
    ("align", ["objective.per_sample"]),   # on CPU an align-only run's one fused static graph (engine/row_scoring.py), which align then reuses
    ("grad", ["model.forward", "contract.objective"]),      # grad scores no rows: the batch call
])
def test_the_probe_checks_the_objective_through_the_graph_a_stage_uses(tiny_target, stages, graphs):
    from objdebug import api
    from objdebug.core.config import load_config

    result = api.run(load_config(tiny_target / "objdebug.toml"), stages=[stages])
    assert [g.split()[0] for g in result.compiles["by_check"]["contract"]["compiled"]] == graphs


def test_rows_longer_than_the_position_table(tiny_target):
    """PositionalLM names max_position_embeddings = 24: rows above it are named, file:line."""
    data = tiny_target / "align.jsonl"
    rows = [json.loads(x) for x in data.read_text().splitlines()]
    n_long = sum(1 for r in rows if len(r["prompt"]) + max(len(r[k]) for k in ("good", "medium", "bad")) > 24)
    first = next(i for i, r in enumerate(rows, 1)
                 if len(r["prompt"]) + max(len(r[k]) for k in ("good", "medium", "bad")) > 24)
    assert n_long >= 2
    cli_exit_2(["align", "-c", tiny_target / "objdebug.toml",
            "--set", "model.factory='fixtures.contract_targets:build_positional_model'",
            "--set", "model.kwargs={max_positions=24}", "--set", "model.checkpoint=''"],
           f"align.jsonl:{first}: row", "more than the model's 24 positions", f"{n_long} rows are too long")


@pytest.mark.slow
def test_mindspore_error_lines_shown_under_debug(tiny_target):
    """--device GPU on a CPU build: MindSpore's [ERROR] lines about libcuda appear with --debug
    (test_input_errors.py::test_unavailable_device_in_a_real_process: hidden without it)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("GLOG_v", None)
    debug = subprocess.run([sys.executable, "-m", "objdebug.cli", "align", "-c",
                            str(tiny_target / "objdebug.toml"), "--device", "GPU", "--debug"],
                           capture_output=True, text=True, timeout=300, env=env)
    if debug.returncode == 0:
        pytest.skip("this MindSpore build has a GPU backend")
    assert debug.returncode == 2 and "[ERROR]" in debug.stderr


def test_a_check_crashing_on_a_graph_error_names_the_users_line():
    from objdebug.core.findings import Check

    class Crashing(Check):
        name, stage, codes = "crashing", "align", ("OBJ101",)

        def measure(self, ctx, th):
            raise RuntimeError(MATMUL_ERROR)

    (f,) = Crashing().run(None, {}).findings
    assert f.verdict.value == "ERROR" and f.message.endswith("(at /home/u/proj/losses.py:126)")
