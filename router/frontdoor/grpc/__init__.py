"""The gRPC front door (`baton.v1`): `server.GRPCServer`, and `client.BatonClient` for users."""
