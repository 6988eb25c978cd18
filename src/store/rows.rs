//! The rows the flows read, by type: [`Rows`], which every database a
//! backend binds ([`super::driver::Binding`]) decodes. Each type derives
//! `sqlx::FromRow` for any database's row, so a backend writes no
//! decoding of its own: sqlx's type mapping for its database is it.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::outbox::{
    BucketHead, ClaimCandidate, ClaimedMessage, Dropped, MessageDetail, MessageSummary,
};
use super::partitions::{LeaseEvent, LeaseLine, LeaseRow};
use super::workers::{LiveWorker, WorkerView};

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
