"""What every worker actor shares: the actor base (one engine over its TP ranks, one KV
transport per rank, reports and events), rank groups, TP ranks on Ray, transfer outcome
tracking and thread pinning. The role packages (`prefill_worker`, `decode_worker`) build on
it and never import each other."""
