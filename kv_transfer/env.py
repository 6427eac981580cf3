"""UCX settings for machines without a GPU, applied before a backend creates its UCX context.

Only variables the operator has not set are touched.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def apply_ucx_defaults(loopback: bool = False) -> None:
    """Quiet UCX's unused-variable warnings (ucxx sets some its UCX build ignores); with
    `loopback`, keep UCX's TCP on 127.0.0.1 (single-node tests and benchmarks). Must run
    before the UCX context is created: UCX reads its environment once, at init."""
    defaults = {"UCX_WARN_UNUSED_ENV_VARS": "n"}
    if loopback:
        defaults["UCX_NET_DEVICES"] = "lo"
    for key, value in defaults.items():
        if key not in os.environ:
            os.environ[key] = value
            logger.debug("set %s=%s", key, value)
