"""Suite-wide settings: keep every process on few threads so two cores are shared sanely."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
