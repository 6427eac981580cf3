"""The chaos tests run on the cluster tests' local Ray (tests/cluster/conftest.py) and,
under `--redis`, on a redis-server of their own (tests/router/conftest.py)."""

from tests.cluster.conftest import cluster_factory, ray_session  # noqa: F401 - fixtures
from tests.router.conftest import own_redis  # noqa: F401 - fixture
