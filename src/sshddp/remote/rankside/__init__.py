"""The rank side: what runs inside the node's processes. ``agent`` (the shim torchrun
starts through), ``rank`` (the shim every rank starts through), ``ranksite`` (the node's
sitecustomize) and ``rankout`` (each rank's own output FIFO).
"""
