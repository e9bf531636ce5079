import os
import sys
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402

FIXTURES = ROOT / "fixtures"
TARGETS = FIXTURES / "targets"


@pytest.fixture
def tiny_target(tmp_path):
    """A copy of fixtures/targets/tiny in a temp dir, safe to edit."""
    import shutil

    dst = tmp_path / "tiny"
    shutil.copytree(TARGETS / "tiny", dst)
    return dst


def messages(text: str) -> list[str]:
    """What a command said, less the progress lines a non-terminal stream gets while it runs
    (`objdebug: align (1/7): started`, ...): an input error must still be exactly one line."""
    return [line for line in text.strip().splitlines()
            if not (line.startswith("objdebug: ") and not line.startswith("objdebug: error:"))]
