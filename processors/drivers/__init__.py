"""One driver per stage: its consumer, its assignment callbacks, its poll and advance, its commit points.

The loop that runs them is `processors.runtime.ProcessorRuntime`; the logic they drive is pure, in
`processors.stages`.
"""

from processors.drivers.base import IDLE_STATE_TOPIC, StageContext, StageDriver, Stats, Topics
from processors.drivers.job import JobDriver
from processors.drivers.node import NodeDriver
from processors.drivers.rekey import RekeyDriver

__all__ = [
    "IDLE_STATE_TOPIC",
    "JobDriver",
    "NodeDriver",
    "RekeyDriver",
    "StageContext",
    "StageDriver",
    "Stats",
    "Topics",
]
