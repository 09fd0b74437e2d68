"""Fixtures shared by the test modules."""
import importlib
import os

# Triton kernels (rollout.decode_attention=triton) run in Triton's interpreter on these CPU machines; it must
# be on before anything imports triton, whose own library functions are decorated at import
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from verl.utils.tiny import tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tok():
    """The tiny BPE tokenizer (routing tags as added tokens) that most tests encode with; a module that needs
    another one defines its own `tok`."""
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module (`pytestmark = pytest.mark.usefixtures("one_thread")`): tiny matmuls on a
    shared 2-core box, where thread hand-off costs more than the work."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def trained_router(tmp_path_factory):
    """The tiny router of serve_fixture, trained once per session (it takes seconds to a minute on a busy box)
    and shared by the modules that serve it; they must not write into it."""
    from serve_fixture import build_trained_router

    return build_trained_router(tmp_path_factory.mktemp("router") / "hf")


def require_triton():
    """triton, or a skip where it is missing; under CI (.ci/run installs it) a missing triton fails instead, so
    the kernels' tests never skip there."""
    if os.environ.get("CI") == "true":
        import triton
        return triton
    return pytest.importorskip("triton")


def interpreted_kernel(module: str):
    """A Triton kernel module, imported with the interpreter on (set above, before anything imports triton)."""
    assert os.environ.get("TRITON_INTERPRET") == "1", "conftest.py turns Triton's interpreter on"
    return importlib.import_module(module)
