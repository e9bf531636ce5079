import os
import sys
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")
# The CLI caches compiled graphs in ./.objdebug_cache by default: a suite of CLI runs would leave
# one in the repository and make later runs warm. Off for every test (and its subprocesses) unless
# a test names a cache (--compile-cache DIR) or removes this variable (tests/test_compile_cache.py).
os.environ.setdefault("OBJDEBUG_NO_CACHE", "1")

# pytest-xdist (README's test command runs two workers) starts each worker under `python -c`;
# MindSpore's compile cache hashes the entry script, which a serial `python -m pytest` has:
# pytest's own __main__.py. Give the workers the same entry, before MindSpore is imported (it
# reads sys.argv[0] once, at import).
if os.environ.get("PYTEST_XDIST_WORKER") and not os.path.isfile(sys.argv[0] if sys.argv else ""):
    import pytest as _pytest

    sys.argv[:1] = [os.path.join(os.path.dirname(_pytest.__file__), "__main__.py")]

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

# `--dist loadfile` hands whole files to the two workers, by default the files with the most tests
# first: a file of a few slow tests (real msrun workers, whole runs) then comes last and one worker
# runs it alone while the other idles. These files go first (longest first, measured with
# `pytest -n 0 FILE` on the shared 2-core machine); a file missing here only costs balance.
HEAVY_FILES = (
    "test_label_pairing.py",          # 142 s (17 tests): whole runs of grad, invariants, stress
    "test_policy.py",                 # ~95 s (45 tests): the policy stage's fixtures and twins, OBJ837, the ported losses
    "test_ecosystem_logits.py",       # 124 s (18 tests): library models, graph-mode probe
    "test_gate_workers.py",           # ~75 s (3 tests): real msrun workers and signals
    "test_batches_other_stages.py",   # 70 s (7 tests)
    "test_batches_offsets.py",        # ~65 s (10 tests): offsets -1..+2 on six objective forms
    "test_distributed.py",            # 44 s (7 tests): two workers vs one process
    "test_llama_fixture.py",          # 34 s (3 tests)
    "test_memory_release.py",         # 24 s (3 tests)
    "test_demo_align.py",             # 22 s (3 tests)
    "test_model_vocabulary.py",       # ~200 s on the shared cores (13 tests): the reward CLI runs and twins, Llama probes
    "test_preference_forms.py",       # ~40 s default (24 tests): three forms' contexts; slow: two more ci-gate CLI runs
    "test_reward.py",                 # ~90 s on the 2 shared cores (23 tests): two model compiles + reward twins
    "test_reward_llama.py",           # 8 s default (1 test); 160 s with -m slow: the Llama reward model's compiles
    "test_chat_llama.py",             # ~22 s default (6 tests): one Llama objective probe; slow: the preference twins, whole runs
    "test_chat_docs.py",              # ~22 s (67 tests): docs' [chat] blocks x forms x twins, one Llama objective probe
    "test_chat_template_tokens.py",   # ~17 s (21 tests): a real tokenizer's rows, one Llama objective probe
    "test_tasks_order.py",            # ~26 s (6 tests): the tagger's and the encoder's align twins
    "test_tasks_stress.py",           # slow only (~115 s): the kinds' stress cases and twins
    "test_tasks_correlate.py",        # slow only (~60 s): the kinds' correlate twins
    "test_tasks_decompose.py",        # slow only (~65 s): the kinds' composite objectives and twins
    "test_tasks_fd.py",               # slow only (~55 s): the kinds' finite differences
    "test_tasks_llama.py",            # ~55 s default (4 tests); -m slow: 7 more twins (~5 min), 13 whole Llama runs (~20-40 min)
)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist's
def pytest_xdist_make_scheduler(config, log):
    if getattr(config.option, "dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class HeavyFirst(LoadFileScheduling):
        _ordered = False

        def _assign_work_unit(self, node):
            if not self._ordered:  # the queue is complete before the first file is handed out
                self._ordered = True
                rank = {f"tests/{name}": i for i, name in enumerate(HEAVY_FILES)}
                units = sorted(self.workqueue.items(), key=lambda unit: rank.get(unit[0], len(rank)))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return HeavyFirst(config, log)


FIXTURES = ROOT / "fixtures"
TARGETS = FIXTURES / "targets"


@pytest.fixture
def tiny_target(tmp_path):
    """A copy of fixtures/targets/tiny in a temp dir, safe to edit."""
    import shutil

    dst = tmp_path / "tiny"
    shutil.copytree(TARGETS / "tiny", dst)
    return dst


# single-prompt rows without eos_id: the EOS checks, the conversation checks (no [chat]) and the
# pair checks (no chosen / rejected columns) skip, each saying why
SKIPPED_ON_PLAIN_ROWS = {"OBJ020": "data.eos_id is not set", "OBJ022": "data.eos_id is not set",
                         **{f"OBJ0{i}": "no [chat] section" for i in range(23, 29)},
                         **{f"OBJ03{i}": "no chosen / rejected columns" for i in range(6)}}


def without_plain_row_skips(found: dict) -> dict:
    """`found` ({code: (verdict, message)}) less the SKIPs of SKIPPED_ON_PLAIN_ROWS, each checked
    to be a SKIP that says its reason (a code absent from `found` is fine: not every run asks it)."""
    from objdebug.core.findings import Verdict

    found = dict(found)
    for code, why in SKIPPED_ON_PLAIN_ROWS.items():
        if code in found:
            verdict, message = found.pop(code)
            assert verdict is Verdict.SKIP and why in message, (code, message)
    return found


def target_context(name: str, profile, stage: str):
    """A Context on the fixture target `fixtures/targets/<name>` as the runner builds one (the
    runtime set up from its [run], its target loaded, an Engine at the profile's batch size), for
    running a stage's checks one at a time: `profile` a Profile, `stage` the engine's stage."""
    from objdebug.core.config import load_config
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context

    cfg = load_config(TARGETS / name / "objdebug.toml")
    runtime.setup(cfg.run.device, cfg.run.mode, cfg.run.seed)
    target = load_target(cfg)
    engine = Engine(target, batch_size=profile.section("engine")["batch_size"])
    engine.stage = stage
    return Context(config=cfg, target=target, engine=engine, profile=profile)


def messages(text: str) -> list[str]:
    """What a command said, less the progress lines a non-terminal stream gets while it runs
    (`objdebug: align (1/7): started`, ...): an input error must still be exactly one line."""
    return [line for line in text.strip().splitlines()
            if not (line.startswith("objdebug: ") and not line.startswith("objdebug: error:"))]


def digest(path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def cli_exit_2(args, *needles, unchanged=()):
    """Invoke the CLI in-process: exit 2, exactly one `objdebug: error:` line (progress lines
    aside), no traceback, every needle in the output, the `unchanged` files not modified."""
    from typer.testing import CliRunner

    from objdebug.cli import app

    before = {p: digest(p) for p in unchanged}
    result = CliRunner().invoke(app, [str(a) for a in args])
    out = result.output
    assert result.exit_code == 2, out
    assert "Traceback" not in out
    assert out.count("objdebug: error:") == 1 and len(messages(out)) == 1, out
    for needle in needles:
        assert needle in out, out
    for p, h in before.items():
        assert digest(p) == h, f"{p} was modified"
    return out


def settings(section: str, **changes):
    """A profile section as checks receive it: default.toml's values, `changes` over them."""
    from objdebug.pipeline.profile import load_profile

    return load_profile("default").section(section).replace(**changes)


def only_checks(monkeypatch, **names):
    """`api.run` with only the named checks of a stage (`grad={"padding-leakage"}`): a `select`
    filters findings but every check of the stage still runs; a test that asserts on one check's
    codes need not pay for the others' graphs. Stages not named keep all their checks."""
    from objdebug import api
    from objdebug.stages import stage_checks

    def checks_of(stage):
        keep = names.get(stage)
        found = stage_checks(stage)
        if keep is None:
            return found
        assert keep <= {c.name for c in found}, (stage, keep)  # a renamed check fails loudly
        return [c for c in found if c.name in keep]

    monkeypatch.setattr(api, "stage_checks", checks_of)
