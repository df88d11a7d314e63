//! Durable thread storage: the Store trait with SQLite and PostgreSQL implementations.
