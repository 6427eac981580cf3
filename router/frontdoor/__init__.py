"""The front doors: the backend contract they serve through, request validation and chat
encoding (once, for every door), the OpenAI HTTP API, gRPC, metrics and the admin API.
No Ray, no torch: a front door sees the cluster only through `backend.Backend` and
`admin_api.ClusterAdmin`."""
