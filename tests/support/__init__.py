"""Test doubles and harnesses: in-process backends and admins, servers on threads."""
