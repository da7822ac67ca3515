"""The notebook side of Kiwi: what runs inside an IPython kernel.

- ``extension``: the IPython extension (``%load_ext kiwi_jupyter``): per-cell hooks that take the
  GPU before a cell runs and give it back after; ``cells``: which cells wait, and where;
- ``gpu``: how a cell gets the GPU, behind one small interface (``Arbiter``): through the
  kernel's own scheduler client, or through the CUDA shim (``gpu_shim``) where it is loaded;
- ``link``: the kernel's connection to the node daemon, and what happens when it is gone;
- ``waiting``: the live line a waiting cell shows; ``status_view``: ``%kiwi status``;
- ``magics``: ``%kiwi``; ``config``: the traitlets options;
- ``standin``: a stand-in GPU (NumPy) whose memory Kiwi counts and moves, where there is none;
- ``launcher`` (``python -m kiwi_jupyter.kernel``) and ``app``: the Kiwi kernel, shim preloaded.

Nothing here is imported by ``python -m kiwi_jupyter.kernel`` before it has decided whether to
re-execute itself with the shim preloaded, so this file stays free of imports.
"""
