"""The notebook side's benchmarks: a kernel's cells through ``jupyter_client``
(``kernel_cells``) and the Jupyter server's status endpoint and panel (``panel``)."""
