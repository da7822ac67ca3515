"""The Kiwi device plugin: advertises vGPUs to the kubelet so that many pods can share a GPU.

Each physical GPU is offered as ``--vgpus-per-gpu`` devices of one extended resource
(``arrikto.com/gpu``). A pod that gets one is pointed at the node's Kiwi scheduler socket and the
CUDA shim, and sees only the physical GPU its vGPU belongs to. Rooms:

- ``api/``         the kubelet's device plugin API v1beta1 (proto and generated modules)
- ``gpus.py``      which physical GPUs the node has and whether each is healthy (NVML, or fake)
- ``vgpus.py``     vGPU ids and what a container is given for them (environment, mounts)
- ``service.py``   the gRPC DevicePlugin service the kubelet calls
- ``kubelet.py``   registering with the kubelet, and again when the kubelet restarts
- ``main.py``      the ``kiwi-device-plugin`` command
"""
