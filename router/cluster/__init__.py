"""The Ray side of the control plane: the pool controller actor, bringing a cluster up,
membership and worker reports, and the request path across the pools."""
