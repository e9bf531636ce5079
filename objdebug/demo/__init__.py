"""Bundled demo target of objdebug: a tiny byte-level causal LM trained on a rule-generated
corpus, its training script, a rule-based rater and evaluation data. See ``docs/demo.md``."""
import os

DEMO_DIR = os.path.dirname(os.path.abspath(__file__))
CONFIG_PATH = os.path.join(DEMO_DIR, "objdebug.toml")
CHECKPOINT_PATH = os.path.join(DEMO_DIR, "demo.ckpt")

__all__ = ["DEMO_DIR", "CONFIG_PATH", "CHECKPOINT_PATH"]
