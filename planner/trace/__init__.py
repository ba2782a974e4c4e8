"""From a MODEL to blocks: build the model on the meta device, trace it with torch.fx or
torch.export, reduce the nodes to ops, find tensor-parallel roles, coarsen into layer-sized blocks
and sum their work. The only package on the planning path that imports torch (graph.py and
ops.py do not: the search reads their plain data)."""
