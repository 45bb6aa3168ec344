"""numpy's BLAS threads (mnemo/graph/blas.py): limited when a Memory opens, unless the
application chose them itself; the libraries whose threads faiss shares are left alone."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

import mnemo
from mnemo.graph.blas import limit_blas_threads


def own_threaded() -> list[int]:
    """The thread counts of the BLAS libraries with threads of their own (pthreads)."""
    return [lib.num_threads for lib in ThreadpoolController().select(user_api="blas")
            .lib_controllers if lib.info().get("threading_layer") == "pthreads"]


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    """Each test starts from two threads per library (what a 2-core machine has), and the
    process gets its own counts back after."""
    assert np.ones(2) @ np.ones(2) == 2.0  # numpy's BLAS is loaded
    controller = ThreadpoolController()
    before = [(lib, lib.num_threads) for lib in controller.lib_controllers]
    for lib, _ in before:
        lib.set_num_threads(2)
    yield
    for lib, threads in before:
        lib.set_num_threads(threads)


def test_numpys_blas_gets_the_threads_asked_for() -> None:
    if not own_threaded():
        pytest.skip("this numpy's BLAS has no threads of its own (an OpenMP or sequential "
                    "build): nothing to limit")
    assert limit_blas_threads(1, environ={})
    assert set(own_threaded()) == {1}


def test_an_application_that_chose_is_left_alone() -> None:
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        assert not limit_blas_threads(1, environ={name: "2"})
    assert not limit_blas_threads(None, environ={})
    assert set(own_threaded()) <= {2}


def test_openmp_libraries_are_left_alone() -> None:
    openmp = ThreadpoolController().select(user_api="openmp")
    before = [lib.num_threads for lib in openmp.lib_controllers]
    limit_blas_threads(1, environ={})
    assert [lib.num_threads for lib in openmp.lib_controllers] == before


async def test_a_memory_limits_them_when_it_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    if not own_threaded():
        pytest.skip("this numpy's BLAS has no threads of its own: nothing to limit")
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                 "BLIS_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    async with mnemo.Memory(":memory:", embedder=mnemo.HashEmbedder()):
        assert set(own_threaded()) == {1}


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "1"])
def test_blas_threads_must_be_a_positive_integer_or_none(value: object) -> None:
    with pytest.raises(mnemo.InvalidInputError):
        mnemo.Config(blas_threads=value)  # type: ignore[arg-type]


async def test_the_libraries_are_walked_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding the libraries walks every one loaded, on the event loop: a Memory opened after
    the first one limits the ones found then."""
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                 "BLIS_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    limit_blas_threads(1, environ={})
    walks: list[ThreadpoolController] = []

    def walk() -> ThreadpoolController:
        walks.append(ThreadpoolController())
        return walks[-1]

    monkeypatch.setattr("mnemo.graph.blas.ThreadpoolController", walk)
    for threads in (2, 1):
        limit_blas_threads(threads, environ={})
        assert set(own_threaded()) <= {threads}
    async with mnemo.Memory(":memory:", embedder=mnemo.HashEmbedder()):
        pass
    assert walks == []
