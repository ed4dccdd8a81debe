"""`%gpumem`: who holds the memory in this notebook, named by the path a user would type, reconciled with the
allocator, and given back without restarting the kernel. Pure modules: result, reconcile, history, render;
probe layer: roots, walk, graph, allocator, free, watch, runner."""
