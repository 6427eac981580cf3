"""The prefill worker: runs prompts, samples their first token, and ships each layer's KV to
the decode worker's reserved blocks while the next layer computes."""
