"""The gRPC front door (`baton.v1`): `GRPCServer` on a running loop, or `GRPCServerThread`."""

from router.grpc.runner import GRPCServerThread
from router.grpc.server import GRPCServer

__all__ = ["GRPCServer", "GRPCServerThread"]
