"""Graph encoders and placement policies on torch-geometric.

- :mod:`gnn.features`: a :class:`placer.cost.Problem` as a heterogeneous
  graph (ops and devices; flows, links and candidate placements);
- :mod:`gnn.model`: :class:`Encoder` (GATv2 / GINE / DirGNNConv) and
  :class:`PlacementPolicy` (per-op distributions over the cluster's devices,
  one-shot and refinement decoding);
- :mod:`gnn.dense`: the encoder's inference without message passing (its
  candidate and link layers are dense; same weights, same outputs);
- :mod:`gnn.train`: REINFORCE training with a curriculum (``train_policy.py``);
- :mod:`gnn.strategies`: the ``rl`` and ``hybrid`` strategies, registered with
  :mod:`placer.search` when this package is imported.

>>> import gnn
>>> from placer.search import strategies
>>> {"rl", "hybrid"} <= set(strategies())
True
"""

from .checkpoint import default_checkpoint, load_policy, save_policy
from .features import ProblemGraph, encode_problem
from .model import Encoder, PlacementPolicy, PolicyConfig
from .strategies import RL, Hybrid, policy_plans

__all__ = ["Encoder", "PlacementPolicy", "PolicyConfig", "ProblemGraph", "encode_problem",
           "load_policy", "save_policy", "default_checkpoint", "RL", "Hybrid", "policy_plans"]
