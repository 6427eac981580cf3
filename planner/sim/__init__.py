"""A discrete-event model of a Baton cluster, timed by a `baton profile` and routed by the
real router (router.routing), so it decides as a served cluster does.

    prefill.py       one prefill worker: an LRU prefix cache in front of its queue
    prefill_pool.py  a trace through one or more routers into prefill workers; the oracle
    misses.py        where a policy's prefix misses come from, against the oracle
    decode.py        one decode worker: continuous batching, its own prefills mixed in
    host.py          the host's cores shared by the engines and the serving work
    cluster.py       the whole cluster, prefill and decode pools: what `baton plan` runs
"""
