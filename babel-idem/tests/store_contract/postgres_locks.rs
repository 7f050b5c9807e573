//! What a PostgreSQL test reads of the server's own state.

/// How many statements whose text names `table` wait on a lock right now
/// (`pg_stat_activity`): how a test sees a concurrent statement block on a
/// row another transaction holds.
pub async fn lock_waiters<'e>(db: impl sqlx::PgExecutor<'e>, table: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'",
    )
    .bind(table)
    .fetch_one(db)
    .await
    .expect("pg_stat_activity")
}
