"""The SQLite layer of a page's and a repository's database: connections on their own threads,
the schema and its SQL statements."""
