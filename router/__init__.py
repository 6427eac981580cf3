"""The control plane, in four parts that import one way (docs/architecture.md):

    routing/    pure decisions: the router, its prefix index and stores, policies, load
    frontdoor/  the backend contract, request validation, OpenAI HTTP, gRPC, metrics, admin
    cluster/    the Ray side: controller, bring-up, membership, the request path
    cli/        `baton serve`, `baton make-tiny-model`, ...

`routing` and `frontdoor` are torch-free and Ray-free; `cluster` starts the worker actors.
"""
