"""gemmgen as a torch.compile backend: `torch.compile(model, backend="gemmgen")`.

- `backend`: the backend function registered with dynamo, and its options;
- `graph_pass`: the post-grad pass that replaces matmuls with the `gemmgen::gemm` op;
- `joins`: sibling products of one activation joined into one wider GEMM;
- `ops`: the torch operators the pass inserts;
- `tuning`: tuning the problems a compile found without a measured kernel.
"""
