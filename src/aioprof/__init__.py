"""aioprof: a profiler and event-loop monitor for asyncio programs.

Per task and per coroutine: busy (running on the loop, wall and CPU), scheduled (ready,
waiting for the loop) and idle (suspended) time, the await sites the idle time is
charged to, and the creation site of every task. See README.md and docs/.

`import aioprof` imports neither asyncio nor the C core: `LoopMonitor` (which needs
asyncio) is loaded on first use, the core when a profiler starts.
"""
from typing import Any

from aioprof.profiler import Profiler

__all__ = ["LoopMonitor", "Profiler", "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "LoopMonitor":
        from aioprof.monitor import LoopMonitor

        globals()["LoopMonitor"] = LoopMonitor
        return LoopMonitor
    raise AttributeError(f"module 'aioprof' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(list(globals()) + ["LoopMonitor"])
