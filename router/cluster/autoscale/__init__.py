"""Sizing the prefill and decode pools to TTFT / ITL targets while the cluster runs
(`baton serve --autoscale`): the decision (policy.py), what it reads (signals.py), and the
controller's loop that applies it (loop.py)."""
