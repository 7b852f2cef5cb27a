"""aioprof: a profiler and event-loop monitor for asyncio programs.

Per task and per coroutine: busy (running on the loop, wall and CPU), scheduled (ready,
waiting for the loop) and idle (suspended) time, the await sites the idle time is
charged to, and the creation site of every task. See README.md and docs/.
"""
from aioprof.monitor import LoopMonitor
from aioprof.profiler import Profiler

__all__ = ["LoopMonitor", "Profiler", "__version__"]
__version__ = "0.1.0"
