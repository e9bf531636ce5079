"""Preference batches under every preference objective form (issue 53 cause 4): the pair checks
(OBJ030-OBJ035) read only the batches, so they run whether the preference loss is the target's
`[objective]` (`call = "preference"`, `"preference-pairs"`) or a `[preference]` section beside a
cross-entropy `[objective]`. Before, the first two skipped the whole batches stage ("needs a
cross-entropy-style objective") and exit 0 on every pair bug.

Each configuration is docs/config.md's "Preference objectives" example as a user copies it (its
placeholders replaced by the demo model, its `[data]` by the "Preference batches" example's
MindFormers DPO keys), on fixtures/preference_pipelines.py's MindFormers layout, healthy and with
each of the six pair bugs. The batches stage's checks run in-process, one Context per form
(one compile each); the healthy twins pass `--profile ci-gate` through the CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from objdebug.core.config import load_config
from objdebug.core.findings import Verdict

from .conftest import ROOT
from .doc_snippets import section_blocks

FORMS = ("preference", "preference-pairs", "[preference]")
BUGS = {  # bug -> (packed layout, the code that must FAIL)
    "rejected_prompt_scored": (False, "OBJ031"),   # the prompt masked in chosen only
    "doubled_bos": (False, "OBJ033"),
    "empty_rejected": (False, "OBJ032"),           # an answer truncated to nothing
    "different_prompts": (False, "OBJ030"),
    "first_token_dropped": (False, "OBJ034"),
    "lens_with_padding": (True, "OBJ035"),         # lens that disagree with loss_mask
}
DEMO = ROOT / "objdebug" / "demo"


def config_text(form: str, bug: str | None = None, packed: bool = False) -> str:
    """docs/config.md's preference example in `form`, on the demo model, reading the MindFormers
    DPO batches (the docs' "Preference batches" block: plain, or packed)."""
    doc = section_blocks("### Preference objectives (DPO, IPO, SimPO, hinge)")[0]
    data = section_blocks("### Preference batches: chosen and rejected columns")[2 if packed else 1]
    model, rest = doc.split("[objective]", 1)
    objective, rest = rest.split("[reference]", 1)
    model = model.replace('factory = "mypkg.models:build_lm"',
                          'factory = "objdebug.demo.model:build_model"\n'
                          'kwargs = { vocab_size = 256, d_model = 64, n_layers = 2, n_heads = 4 }')
    model = model.replace('"ckpt/sft.ckpt"', f'"{DEMO / "demo.ckpt"}"')
    rest = rest.replace('"ckpt/sft.ckpt"', f'"{DEMO / "reference.ckpt"}"')
    if bug:
        kwargs = '{ packed = true, bug = "%s" }' % bug if packed else '{ bug = "%s" }' % bug
        data = (data.replace("batches_kwargs = { packed = true }", f"batches_kwargs = {kwargs}") if packed
                else data.replace("shift = true", f"batches_kwargs = {kwargs}\nshift = true"))
    data_keys = data.split("[data]\n", 1)[1]
    if form == "preference-pairs":
        objective = (objective.replace("objdebug.losses:SigmoidDPOLoss", "fixtures.preference_losses:PairsDPO")
                     .replace('call = "preference"  ', 'call = "preference-pairs"'))
    head = "[objective]"
    extra = ""
    if form == "[preference]":  # beside a cross-entropy [objective], which needs rows to score
        objective = "\n".join(line for line in objective.splitlines() if not line.startswith("call"))
        head = ('[objective]\nfactory = "objdebug.losses:MaskedCrossEntropy"\n'
                'kwargs = { ignore_index = -100 }\n\n[preference]')
        extra = f'align = "{DEMO / "align.jsonl"}"\nscores = "{DEMO / "scores.jsonl"}"\n'
    rest = rest.split("[data]", 1)[0]
    return (model + head + objective + "\n[reference]" + rest + "[data]\n" + data_keys + extra
            + '\n[run]\ndevice = "CPU"\nseed = 0\n')


def test_the_configs_are_the_docs_examples():
    text = config_text("preference")
    assert 'call = "preference"' in text and "fixtures.preference_pipelines:mindformers" in text
    assert 'call = "preference-pairs"' in config_text("preference-pairs")
    section = load_config_text(config_text("[preference]", "lens_with_padding", packed=True))
    assert section.preference is not None and section.objective.call == "flat"
    assert section.data.batches_kwargs == {"packed": True, "bug": "lens_with_padding"}


def load_config_text(text: str, folder=None):
    import tempfile

    folder = folder or tempfile.mkdtemp(prefix="objdebug-prefforms-")
    path = os.path.join(folder, "objdebug.toml")
    with open(path, "w") as fh:
        fh.write(text)
    return load_config(path)


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    """{form: {bug or None: {code: (verdict, message)}}}: every batches-stage check of each form's
    config on the healthy batches and each bug twin, one Context (target, engine) per form."""
    from objdebug.engine import runtime
    from objdebug.engine.core import Engine
    from objdebug.engine.target import load_target
    from objdebug.pipeline.context import Context
    from objdebug.pipeline.preference_batches import real_pairs
    from objdebug.pipeline.profile import load_profile
    from objdebug.pipeline.runner import run_check
    from objdebug.stages import stage_checks
    from objdebug.stages.batches.audit import audit, real_batches
    from objdebug.stages.batches.pair_checks import pairs_of

    runtime.setup("CPU", "graph", 0)
    out = {}
    for form in FORMS:
        tmp = tmp_path_factory.mktemp("form")
        cfg = load_config_text(config_text(form), tmp)
        target = load_target(cfg)
        ctx = Context(config=cfg, target=target, engine=Engine(target), profile=load_profile("ci-gate"))
        th = ctx.profile.section("batches")
        found = {}
        for bug in [None, *BUGS]:
            packed = bool(bug) and BUGS[bug][0]
            ctx.config = load_config_text(config_text(form, bug, packed), tmp)
            for f in (audit, real_batches, pairs_of, real_pairs):
                ctx.forget(f)
            found[bug] = {f.code: (f.verdict, f.message) for c in stage_checks("batches")
                          for f in run_check(c, ctx, th).findings}
        out[form] = found
    return out


@pytest.mark.parametrize("form", FORMS)
def test_the_healthy_pairs_pass_every_batches_check_in_each_form(judged, form):
    found = judged[form][None]
    bad = {c: v for c, v in found.items() if v[0] not in (Verdict.PASS, Verdict.SKIP)}
    assert not bad, bad
    for code in ("OBJ030", "OBJ031", "OBJ032", "OBJ033", "OBJ034", "OBJ015"):
        assert found[code][0] is Verdict.PASS, (code, found[code])


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_each_pair_bug_fails_with_a_code_its_healthy_twin_lacks_in_each_form(judged, form, bug):
    code = BUGS[bug][1]
    healthy = {c for c, (v, _) in judged[form][None].items() if v is Verdict.FAIL}
    verdict, message = judged[form][bug][code]
    assert verdict is Verdict.FAIL and code not in healthy, message


def test_the_checks_that_probe_a_label_loss_say_why_they_skip_under_a_preference_call(judged):
    verdict, message = judged["preference"][None]["OBJ010"]
    assert verdict is Verdict.SKIP and 'call = "preference": the objective takes preference pairs' in message
    assert judged["[preference]"][None]["OBJ010"][0] is Verdict.PASS  # a CE objective to probe


def _cli(args, cwd, timeout=900):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "objdebug.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("form", [pytest.param("preference"),
                                  pytest.param("preference-pairs", marks=pytest.mark.slow),
                                  pytest.param("[preference]", marks=pytest.mark.slow)])
def test_the_healthy_twin_passes_ci_gate_through_the_cli(tmp_path, form):
    (tmp_path / "objdebug.toml").write_text(config_text(form))
    proc = _cli(["run", "-c", "objdebug.toml", "--profile", "ci-gate", "--json", "r.json"], tmp_path)
    report = json.loads((tmp_path / "r.json").read_text())
    found = {f["code"]: f["verdict"] for r in report["results"] for f in r["findings"]}
    bad = {c: v for c, v in found.items() if v in ("FAIL", "WARN", "ERROR")}
    assert proc.returncode == 0 and not bad, (bad, proc.stderr[-2000:])
    assert found["OBJ031"] == "PASS" and found["OBJ801"] == "PASS"  # pair checks and the preference stage
