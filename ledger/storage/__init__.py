"""What is stored and how it is read: a root's files and snapshot cuts (paths), the Parquet writer
(store), the Iceberg tables (tables), chain heads (heads), locks, streams of stored files (streams),
and the move of an old plain root (migrate)."""
