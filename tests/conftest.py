import os
import sys
from pathlib import Path

# Triton kernels run on the CPU under the interpreter; it must be set before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

torch.set_num_threads(1)
os.environ["INTERP_PROGRESS"] = "0"  # no progress bars in test output (models.memory.progress_bar)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def triton_interpreter_available() -> bool:
    """Triton kernels can run here: a GPU, or the CPU interpreter (TRITON_INTERPRET=1)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
