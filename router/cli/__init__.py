"""`baton`: the command line (`baton serve`, `baton demo`, `baton make-tiny-model`,
`baton quantize`, plugins)."""
