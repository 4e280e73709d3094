"""What is stored and how it is read: a root's files and snapshot cuts (paths), the Iceberg tables
(tables), the events as Arrow tables (rows), their files on disk (files) and digests (digest), the
writer (store), what is stored (reads, index), the stream position and root id (positions), recovery
after a crash (recovery), compaction (compaction), chain heads (heads), locks, streams of stored files
(streams)."""
