"""`baton bench`: open-loop load against a serving cluster, and the workloads it sends.

traces.py     a workload as trace rows (Mooncake JSONL, Azure CSV, synthetic generators)
workloads.py  what to send and when: token ids drawn per hash id, arrivals, workloads
client.py     the open-loop client: each request sent at its arrival, its stream timed
metrics.py    what a run measured and the arithmetic of its report (TTFT, TPOT, goodput)
run.py        one measured run against one server, /metrics scraped around it
server.py     `baton serve` as a subprocess the benchmark owns (free ports, stop by PID)
compare.py    `--compare pd|policy|mooncake`: configurations side by side in one run
peer.py       `--compare peer`: `baton serve` against `vllm serve`, same client and cores
plot.py       latency and goodput against rate, one PNG per experiment
report.py     markdown tables from a comparison's JSON
cli.py        the command's flags (the workload flags are shared with `baton plan`)
"""
