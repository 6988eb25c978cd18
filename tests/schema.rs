//! The schema: SQL partitioner against the independent test vectors, the
//! producer API's transactional behaviour, the index that serves claims.

mod common;

use common::*;
use outboxd::partitioner::Partitioner;
use outboxd::producer::{Message, Producer};
use serde_json::Value;

fn vectors() -> Vec<Value> {
    read_repo_file("tests/vectors/partitioner.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn rust_partitioner_matches_the_python_zlib_vectors() {
    let vs = vectors();
    assert!(vs.len() >= 60);
    for v in &vs {
        let key = v["key"].as_str().unwrap();
        assert_eq!(
            crc32fast::hash(key.as_bytes()) as u64,
            v["crc32"].as_u64().unwrap(),
            "{key}"
        );
        for count in [1u32, 7, 16, 100, 1000] {
            let expected = v[format!("label_{count}")].as_str().unwrap();
            assert_eq!(
                Partitioner::new(count).label_for(key),
                expected,
                "{key} / {count}"
            );
        }
    }
}

#[tokio::test]
async fn sql_partitioner_matches_the_python_zlib_vectors() {
    for count in [7u32, 16, 100] {
        let env = TestEnv::with(Tuning {
            partition_count: count,
            ..Tuning::default()
        })
        .await;
        for v in vectors() {
            let key = v["key"].as_str().unwrap();
            let (crc, label): (i64, String) = sqlx::query_as(
                "SELECT outbox_crc32(convert_to($1, 'UTF8')), outbox_partition_for($1)",
            )
            .bind(key)
            .fetch_one(&env.store.pool)
            .await
            .unwrap();
            assert_eq!(crc as u64, v["crc32"].as_u64().unwrap(), "crc32 of {key:?}");
            assert_eq!(
                label,
                v[format!("label_{count}")].as_str().unwrap(),
                "{key:?} / {count}"
            );
        }
        // Every bucket has its partitions row.
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_partitions")
            .fetch_one(&env.store.pool)
            .await
            .unwrap();
        assert_eq!(rows, count as i64);
    }
}

#[tokio::test]
async fn enqueue_is_part_of_the_callers_transaction() {
    let env = TestEnv::new().await;
    let producer = Producer::default();
    let pool = &env.store.pool;

    let mut tx = pool.begin().await.unwrap();
    producer
        .enqueue(&mut tx, Message::new("order-1", "", "q", "rolled back"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(env.count("true").await, 0);

    let mut tx = pool.begin().await.unwrap();
    let id = producer
        .enqueue(
            &mut tx,
            Message::new("order-1", "orders", "order.created", br#"{"a":1}"#.to_vec())
                .content_type("application/json")
                .header("tenant", "acme"),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let (key, partition, exchange, headers, ct): (String, String, String, Value, Option<String>) = sqlx::query_as(
        "SELECT message_key, partition_key, exchange, headers, content_type FROM outbox WHERE id = $1",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(key, "order-1");
    assert_eq!(partition, env.partitioner().label_for("order-1"));
    assert_eq!(exchange, "orders");
    assert_eq!(headers["tenant"], "acme");
    assert_eq!(ct.as_deref(), Some("application/json"));
}

#[tokio::test]
async fn plain_sql_producers_get_clear_refusals_for_bad_rows() {
    let env = TestEnv::new().await;
    let pool = &env.store.pool;
    let err = sqlx::query("SELECT outbox_enqueue(NULL, '', 'q', 'x'::bytea)")
        .execute(pool)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("message_key must not be NULL"), "{err}");
    let err = sqlx::query("SELECT outbox_enqueue('k', '', 'q', 'x'::bytea, '[1,2]'::jsonb)")
        .execute(pool)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("outbox_headers_object"), "{err}");
    let err = sqlx::query(
        "INSERT INTO outbox (partition_key, message_key, routing_key, payload) VALUES ('bucket7', 'k', 'q', 'x')",
    )
    .execute(pool)
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("outbox_partition_key_format"), "{err}");
}

#[tokio::test]
async fn the_claim_is_a_range_scan_of_the_pending_index_beside_many_published_rows() {
    let env = TestEnv::new().await;
    let pool = &env.store.pool;
    // 100k published rows first (low ids), then a few pending ones: the
    // shape in which walking the primary key would read every published row.
    sqlx::query(
        "INSERT INTO outbox (partition_key, message_key, routing_key, payload, published_at)
         SELECT 'p' || lpad((g % 16)::text, 2, '0'), 'k' || g, 'q', 'x', now() FROM generate_series(1, 100000) g",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox (partition_key, message_key, routing_key, payload)
         SELECT outbox_partition_for('k' || g), 'k' || g, 'q', 'x' FROM generate_series(1, 2000) g",
    )
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE outbox").execute(pool).await.unwrap();
    let tables = &env.store.tables;
    let mut conn = pool.acquire().await.unwrap();
    // Warm the prepared statement past PostgreSQL's custom-plan phase.
    for _ in 0..6 {
        let rows = tables
            .outbox
            .claim(
                &mut *conn,
                "p03",
                100,
                outboxd::store::outbox::ClaimToken::new(),
                15_000,
                None,
                &[],
            )
            .await
            .unwrap();
        assert!(!rows.is_empty());
        assert!(rows.windows(2).all(|w| w[0].id < w[1].id));
        sqlx::query("UPDATE outbox_partitions SET claim_token = NULL, claimed_until = NULL")
            .execute(&mut *conn)
            .await
            .unwrap();
    }
    // The real claim statement's plan: the pending index only, never a walk
    // of the primary key through 100k published rows.
    let mut tx = pool.begin().await.unwrap();
    let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS) {}",
        tables.outbox.claim_statement()
    )))
    .bind("p03")
    .bind(100i64)
    .bind(uuid::Uuid::new_v4())
    .bind(15_000f64)
    .bind(None::<uuid::Uuid>)
    .bind(None::<i64>)
    .bind(Vec::<i64>::new())
    .fetch_all(&mut tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let plan = plan.join("\n");
    println!("{plan}");
    assert!(plan.contains("outbox_pending_idx"), "{plan}");
    assert!(!plan.contains("outbox_pkey"), "{plan}");
}
