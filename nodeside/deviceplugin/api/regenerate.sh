#!/bin/sh
# Regenerate the Python modules for the kubelet device plugin API from api.proto.
#
# The generated files are committed, so installing kiwi-jupyter never needs protoc or network.
# Run this (from anywhere) after editing api.proto, with grpcio-tools installed:
#     pip install grpcio-tools && nodeside/deviceplugin/api/regenerate.sh
# The proto is compiled from the repository root so that the generated imports are absolute
# (from nodeside.deviceplugin.api import api_pb2) and work from an installed package.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
python=${PYTHON:-python3}
cd "$root"
"$python" -m grpc_tools.protoc -I . \
    --python_out=. --pyi_out=. --grpc_python_out=. \
    nodeside/deviceplugin/api/api.proto
echo "regenerated: $(ls nodeside/deviceplugin/api/api_pb2*.py*)"
