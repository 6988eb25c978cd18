//! The rows the flows read, by type: [`Rows`], which every database a
//! backend binds ([`super::driver::Binding`]) decodes. Each type is
//! `sqlx::FromRow` for any database's row, so a backend writes no
//! decoding of its own: sqlx's type mapping for its database is it.
//!
//! Most types derive it and find each column by name. The claim's rows,
//! the one read on the path of every message, are decoded by position
//! instead: by name, each of a row's 13 columns is a hash look-up of its
//! name, which showed in the worker's CPU a message (BENCHMARKS.md,
//! section 1). Every backend's claim statements return the columns in
//! the order [`CLAIMED_COLUMNS`] names them (`super::statements::ClaimSql`),
//! and a test holds them to it.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::outbox::{
    BucketHead, ClaimCandidate, ClaimedMessage, Dropped, MessageDetail, MessageSummary,
};
use super::partitions::{LeaseEvent, LeaseLine, LeaseRow};
use super::workers::{LiveWorker, WorkerView};

/// The columns of a [`ClaimedMessage`] in the order every claim
/// statement returns them; a claim's read adds `not_ready` and `held`.
pub(crate) const CLAIMED_COLUMNS: [&str; 11] = [
    "id",
    "message_id",
    "partition_key",
    "message_key",
    "exchange",
    "routing_key",
    "headers",
    "content_type",
    "payload",
    "attempts",
    "created_at",
];

/// A value sqlx decodes from a column of `DB`.
pub trait Column<'r, DB: sqlx::Database>: sqlx::Decode<'r, DB> + sqlx::Type<DB> {}
impl<'r, DB: sqlx::Database, T: sqlx::Decode<'r, DB> + sqlx::Type<DB>> Column<'r, DB> for T {}

impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for ClaimedMessage
where
    usize: sqlx::ColumnIndex<R>,
    i64: Column<'r, R::Database>,
    i32: Column<'r, R::Database>,
    Uuid: Column<'r, R::Database>,
    String: Column<'r, R::Database>,
    Option<String>: Column<'r, R::Database>,
    serde_json::Value: Column<'r, R::Database>,
    Vec<u8>: Column<'r, R::Database>,
    DateTime<Utc>: Column<'r, R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        Ok(Self {
            id: row.try_get(0)?,
            message_id: row.try_get(1)?,
            partition_key: row.try_get(2)?,
            message_key: row.try_get(3)?,
            exchange: row.try_get(4)?,
            routing_key: row.try_get(5)?,
            headers: row.try_get(6)?,
            content_type: row.try_get(7)?,
            payload: row.try_get(8)?,
            attempts: row.try_get(9)?,
            created_at: row.try_get(10)?,
        })
    }
}

impl<'r, R: sqlx::Row> sqlx::FromRow<'r, R> for ClaimCandidate
where
    ClaimedMessage: sqlx::FromRow<'r, R>,
    usize: sqlx::ColumnIndex<R>,
    bool: Column<'r, R::Database>,
    Option<bool>: Column<'r, R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        Ok(Self {
            row: ClaimedMessage::from_row(row)?,
            not_ready: row.try_get(CLAIMED_COLUMNS.len())?,
            held: row.try_get(CLAIMED_COLUMNS.len() + 1)?,
        })
    }
}

/// `T` decoded from one of this database's rows.
pub trait Decodes<T>: sqlx::Database {
    fn decode(row: &Self::Row) -> Result<T, sqlx::Error>;
}

impl<DB: sqlx::Database, T> Decodes<T> for DB
where
    T: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    fn decode(row: &DB::Row) -> Result<T, sqlx::Error> {
        T::from_row(row)
    }
}

/// Declares [`Rows`]: every type a flow reads rows as.
macro_rules! rows {
    ($($t:ty),* $(,)?) => {
        /// A database that decodes every type the flows read rows as.
        pub trait Rows: sqlx::Database $(+ Decodes<$t>)* {}

        impl<DB: sqlx::Database $(+ Decodes<$t>)*> Rows for DB {}
    };
}

rows!(
    ClaimedMessage,
    ClaimCandidate,
    MessageSummary,
    MessageDetail,
    BucketHead,
    Dropped,
    LeaseRow,
    LeaseEvent,
    LeaseLine,
    LiveWorker,
    WorkerView,
    (bool,),
    (i32,),
    (i64,),
    (String,),
    (String, i64),
    (String, i64, i64),
    (String, i64, bool),
    (String, Option<Uuid>, i64),
    (i64, String),
    (i64, String, String),
    (i64, String, String, bool),
    (Option<String>, Option<String>),
    (Uuid, f64, f64),
    (DateTime<Utc>,),
    (DateTime<Utc>, i64, i64),
);

#[cfg(test)]
mod tests {
    use super::CLAIMED_COLUMNS;
    use crate::store::settings::Tables;
    use crate::store::statements::{DrainSql, TakeSql};
    use crate::store::{mysql, postgres, sqlite};

    /// `sql` with its whitespace runs made one space.
    fn words(sql: &str) -> String {
        sql.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// The claim's rows are decoded by position: every backend's claim
    /// statements must select the columns in [`CLAIMED_COLUMNS`]' order,
    /// the read's followed by `not_ready` and then `held`.
    #[test]
    fn every_claim_statement_returns_the_decoded_order() {
        let t = Tables::default();
        let backends: [(&str, DrainSql); 3] = [
            ("postgresql", postgres::outbox::drain(&t)),
            ("mysql", mysql::outbox::drain(&t)),
            ("sqlite", sqlite::outbox::drain(&t)),
        ];
        let columns = format!("SELECT {}", CLAIMED_COLUMNS.join(", "));
        for (name, drain) in backends {
            let read = words(drain.claim.read.as_str());
            assert!(read.starts_with(&format!("{columns}, ")), "{name}: {read}");
            let rest = &read[columns.len()..];
            let (not_ready, held) = (rest.find(" AS not_ready, ("), rest.find(") AS held FROM"));
            assert!(
                matches!((not_ready, held), (Some(n), Some(h)) if n < h),
                "{name}: {read}"
            );
            if let TakeSql::Returning(take) = &drain.claim.take {
                let take = words(take.as_str());
                let last = take.rfind(") SELECT ").expect("a final SELECT") + 2;
                assert!(
                    take[last..].starts_with(&format!("{columns} FROM")),
                    "{name}: {take}"
                );
            }
        }
    }
}
