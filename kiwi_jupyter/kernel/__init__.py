"""The notebook side of Kiwi: what runs inside an IPython kernel.

- ``extension``: the IPython extension (``%load_ext kiwi_jupyter``): per-cell hooks that take the
  GPU before a cell runs and give it back after;
- ``gpu``: the two ways a cell gets the GPU, the kernel's own scheduler client (eager) or the
  CUDA shim (lazy), behind one small interface;
- ``link``: the kernel's connection to the node daemon, and what happens when it is gone;
- ``waiting``: the live line a waiting cell shows; ``status_view``: ``%kiwi status``;
- ``magics``: ``%kiwi``; ``config``: the traitlets options;
- ``launcher`` (``python -m kiwi_jupyter.kernel``): the Kiwi kernel, shim preloaded.

Nothing here is imported by ``python -m kiwi_jupyter.kernel`` before it has decided whether to
re-execute itself with the shim preloaded, so this file stays free of imports.
"""
