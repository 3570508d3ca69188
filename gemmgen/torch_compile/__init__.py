"""gemmgen as a torch.compile backend: `torch.compile(model, backend="gemmgen")`.

- `backend`: the backend function registered with dynamo, and its options;
- `graph_pass`: the post-grad pass that replaces matmuls with gemmgen ops, in three roles:
  `patterns` (matching), `decide` (by the database's times), `rewrite` (the graph edits and the
  weights joined at compile time); `counts` holds what it did (`stats()`);
- `ops`: the torch operators the pass inserts;
- `tuning`: tuning the problems a compile found without a measured kernel.
"""
