"""worker/group.py: a one-rank group calls a rank method as a TP rank does, by the rank's own
class, so a role's override runs whichever class named the method (a prefill rank folds its
connector's results into `kv_poll`)."""

from __future__ import annotations

from worker.group import LocalGroup


class Base:
    def kv_poll(self) -> list[str]:
        return ["base"]


class Role(Base):
    def kv_poll(self) -> list[str]:
        return ["role", *super().kv_poll()]


def test_a_role_override_runs_when_the_base_method_is_named() -> None:
    group = LocalGroup(Role())  # type: ignore[arg-type]
    assert group.all(Base.kv_poll) == ["role", "base"]
    assert group.each(Base.kv_poll) == [["role", "base"]]
