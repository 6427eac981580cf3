"""Building blocks of the sampler: logit penalties, top-k / top-p / min-p filters and logprobs.

The public entry point is `engine.sampler` (`Sampler`, `SamplingRow`, `SamplerOutput`,
`make_generator`); these modules are its torch helpers, each testable on its own.
"""
