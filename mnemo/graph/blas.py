"""How many threads numpy's BLAS may use in this process (`Config.blas_threads`), set through
threadpoolctl on the "pthreads" BLAS libraries (not OpenMP ones, which faiss shares). A process
that set one of `CHOSEN_BY` has chosen, and mnemo leaves it alone."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from threadpoolctl import ThreadpoolController

log = logging.getLogger("mnemo")

CHOSEN_BY = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def limit_blas_threads(threads: int | None, environ: Mapping[str, str] = os.environ) -> bool:
    """Limits numpy's own-threaded BLAS to `threads` threads, unless `threads` is None or the
    environment already chose; True when a limit was set."""
    if threads is None or any(environ.get(name) for name in CHOSEN_BY):
        return False
    own = [lib for lib in ThreadpoolController().select(user_api="blas").lib_controllers
           if lib.info().get("threading_layer") == "pthreads"]
    for lib in own:
        if lib.num_threads != threads:
            lib.set_num_threads(threads)
            log.debug("mnemo: %s limited to %d BLAS threads", lib.filepath, threads)
    return bool(own)
