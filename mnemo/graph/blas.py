"""How many threads numpy's BLAS may use in this process (`Config.blas_threads`), set through
threadpoolctl on the "pthreads" BLAS libraries (not OpenMP ones, which faiss shares) loaded at
the first call, numpy's among them. A process that set one of `CHOSEN_BY` has chosen, and mnemo
leaves it alone."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping

from threadpoolctl import LibController, ThreadpoolController

log = logging.getLogger("mnemo")

CHOSEN_BY = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def limit_blas_threads(threads: int | None, environ: Mapping[str, str] = os.environ) -> bool:
    """Limits numpy's own-threaded BLAS to `threads` threads, unless `threads` is None or the
    environment already chose; True when a limit was set."""
    if threads is None or any(environ.get(name) for name in CHOSEN_BY):
        return False
    own = _own_blas()
    for lib in own:
        if lib.num_threads != threads:
            lib.set_num_threads(threads)
            log.debug("mnemo: %s limited to %d BLAS threads", lib.filepath, threads)
    return bool(own)


@functools.cache
def _own_blas() -> list[LibController]:
    """The process's "pthreads" BLAS libraries, found once: threadpoolctl walks every loaded
    library, and each Memory opened limits them on the event loop."""
    return [lib for lib in ThreadpoolController().select(user_api="blas").lib_controllers
            if lib.info().get("threading_layer") == "pthreads"]
