"""`baton serve`'s configuration as typed records: one module per group (model, engine,
cluster, routing, front door, limits, autoscale, transfer), each field a knob with its
default, help text and flag (knob.py); serve.py holds the whole and checks it; docs.py writes
docs/configuration.md from them."""
