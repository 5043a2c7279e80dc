"""pytest set-up for the tpushim package: every test process gets its own
run directory (chip locks), no log files, and a small premapped region by
default; the `system` fixture is a 2-device sim System of 64 MiB."""

import os
import shutil
import sys
import tempfile

import pytest

# Before tpushim starts anything: settings the C++ API reads from the
# environment, for every System the tests create without saying otherwise.
_RUN_DIR = tempfile.mkdtemp(prefix="tpushim-pytest-run-")
os.environ["TPUSHIM_RUN_DIR"] = _RUN_DIR
os.environ.setdefault("TPU_LOG_DIR", "disabled")
os.environ["TPU_PREMAPPED_BUFFER_SIZE"] = str(64 << 20)
os.environ.pop("TPU_PREMAPPED_BUFFER_TRANSFER_THRESHOLD_BYTES", None)
os.environ.pop("LIBTPU_INIT_ARGS", None)
os.environ.pop("TPUSHIM_FAULTS", None)
os.environ.pop("TPU_VISIBLE_CHIPS", None)
os.environ.pop("TPU_VISIBLE_DEVICES", None)
os.environ["TPUSHIM_DEVICE"] = "sim://?devices=2"

import tpushim  # noqa: E402


def pytest_unconfigure(config):
    shutil.rmtree(_RUN_DIR, ignore_errors=True)


@pytest.fixture
def run_dir(tmp_path):
    """A run directory of the test's own (no chip shared with others)."""
    path = tmp_path / "run"
    path.mkdir()
    return str(path)


@pytest.fixture
def system(run_dir):
    with tpushim.System(premapped_buffer_size="64M",
                        device="sim://?devices=2", run_dir=run_dir) as s:
        yield s


@pytest.fixture
def subprocess_env():
    """The environment for a child Python running tpushim."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [os.path.dirname(os.path.dirname(tpushim.__file__)),
                    env.get("PYTHONPATH", "")] if p)
    return env


PYTHON = sys.executable
