"""`baton profile` and `baton plan`: measure a worker, then size the pools for a workload by
replaying it through a model of the cluster timed by that measurement.

    measure.py  an engine's prefill and decode steps timed from its own step totals
    profile.py  `baton profile`: those measurements fitted to the performance model (core/perf)
    plan.py     `baton plan`: every split of the workers simulated, the smallest good one picked
    validate.py `baton plan --validate`: the best splits served for real, ranked beside the plan
    calibration.py  what served runs measured against a plan, as factors on its latencies
    transfer.py the KV transfer between two processes, timed and fitted (`baton profile`)
    sim/        the cluster simulator both `baton plan` and the routing benchmarks replay
"""
