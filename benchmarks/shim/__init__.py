"""The CUDA shim's benchmarks. Without a GPU, on the tests' fake driver: the gate's cost per
call (``gate``) and a turn between two processes (``turns``). On a GPU (``gpu_check`` runs them
all, ``make gpu-check``): paging (``paging``), overhead on real work (``overhead``), the
checkpoint evictor (``checkpoint``), ways out of the GPU for managed memory
(``evict_variants``) and work done side by side (``gpu_corun``)."""
