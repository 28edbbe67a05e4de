"""Where a Kafka puller stands, as one immutable value: whether ``pull`` may hand jobs
out and whether answers still go out are read from it, and every change to it is one of
its methods.

Two things move it. The puller's own lifecycle: JOINING until ``start`` has joined the
group, then SERVING, then DRAINING once ``drain`` begins (or STOPPED on a ``stop``
without one), and ABANDONED when a drain ends, after which answers are dropped. And the
group's rebalances, which aiokafka runs whenever a member comes or goes, in any phase,
the first join inside ``start`` included: its revocation comes before ``start`` returns
and its assignment may come after. So a rebalance in progress is a field of its own, not
a phase between JOINING and SERVING: a puller that has joined while its partitions are
still moving must hand out nothing until they are assigned.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace


class Phase(enum.Enum):
    JOINING = "joining"  # start() has not returned: a consumer still starting cannot fetch
    SERVING = "serving"
    DRAINING = "draining"  # drain() began: jobs in hand get answered, none handed out
    ABANDONED = "abandoned"  # drain() ended: what is still unanswered stays so
    STOPPED = "stopped"  # stop() without a drain: nothing handed out, answers still sent


@dataclass(frozen=True, slots=True)
class PullerState:
    phase: Phase = Phase.JOINING
    rebalancing: bool = False  # between a revocation and the assignment that follows

    @property
    def hands_out(self) -> bool:
        """Whether ``pull`` may fetch and hand jobs out."""
        return self.phase is Phase.SERVING and not self.rebalancing

    @property
    def answers(self) -> bool:
        """Whether the worker's answers are still sent (else its jobs are all let go)."""
        return self.phase is not Phase.ABANDONED

    def joined(self) -> PullerState:
        """``start`` has joined the group; a puller drained or stopped meanwhile stays so."""
        return replace(self, phase=Phase.SERVING) if self.phase is Phase.JOINING else self

    def revoking(self) -> PullerState:
        return replace(self, rebalancing=True)

    def assigned(self) -> PullerState:
        return replace(self, rebalancing=False)

    def draining(self) -> PullerState:
        # Past serving already: a second drain must not send an abandoned puller's answers.
        if self.phase in (Phase.ABANDONED, Phase.STOPPED):
            return self
        return replace(self, phase=Phase.DRAINING)

    def abandoned(self) -> PullerState:
        return replace(self, phase=Phase.ABANDONED)

    def stopped(self) -> PullerState:
        # What a drain abandoned stays abandoned after the stop that follows it.
        return self if self.phase is Phase.ABANDONED else replace(self, phase=Phase.STOPPED)
