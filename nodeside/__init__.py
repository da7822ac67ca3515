"""Everything Kiwi runs on a node, outside notebooks: the per-GPU scheduler daemon, its wire
protocol, the Python client, ``kiwictl`` and the Kubernetes device plugin.

Nothing here imports Jupyter, IPython or tornado: the node image must not need them.
"""

__version__ = "0.1.0"
