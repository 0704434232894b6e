"""Objectives beyond policy gradient over the engine's public seam: DPO, preference pairs, RFT.

Importing this package registers them with the engine (``OBJECTIVES``);
``agentrl.trainer`` imports it, so a Trainer built from anywhere knows them.
"""

from agentrl.trainer.objectives.dpo import DPOObjective

__all__ = ["DPOObjective"]
