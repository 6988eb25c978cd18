use lapin::{BasicProperties, Connection, ConnectionProperties, options::*, types::FieldTable};
use std::time::Instant;
#[tokio::main]
async fn main() {
    let url = std::env::var("AMQP_URL").unwrap();
    let conn = Connection::connect(&url, ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(
        "rtt".into(),
        QueueDeclareOptions::durable(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let props = BasicProperties::default().with_delivery_mode(2);
    let payload = vec![b'x'; 256];
    let n = 2000;
    // serial
    let t = Instant::now();
    for _ in 0..n {
        ch.basic_publish(
            "".into(),
            "rtt".into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            &payload,
            props.clone(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let serial = t.elapsed();
    // pipelined windows of 100
    let t = Instant::now();
    for _ in 0..n / 100 {
        let mut v = Vec::new();
        for _ in 0..100 {
            v.push(
                ch.basic_publish(
                    "".into(),
                    "rtt".into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    &payload,
                    props.clone(),
                )
                .await
                .unwrap(),
            );
        }
        for c in v {
            c.await.unwrap();
        }
    }
    let piped = t.elapsed();
    // 16 channels concurrently, serial each
    let t = Instant::now();
    let mut hs = Vec::new();
    for _ in 0..16 {
        let ch = conn.create_channel().await.unwrap();
        ch.confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let (props, payload) = (props.clone(), payload.clone());
        hs.push(tokio::spawn(async move {
            for _ in 0..n / 16 {
                ch.basic_publish(
                    "".into(),
                    "rtt".into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    &payload,
                    props.clone(),
                )
                .await
                .unwrap()
                .await
                .unwrap();
            }
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
    let par = t.elapsed();
    ch.queue_purge("rtt".into(), QueuePurgeOptions::default())
        .await
        .unwrap();
    println!(
        "serial: {:.0} msg/s ({:?}/msg); pipelined x100: {:.0} msg/s; 16 channels serial: {:.0} msg/s",
        n as f64 / serial.as_secs_f64(),
        serial / n,
        n as f64 / piped.as_secs_f64(),
        n as f64 / par.as_secs_f64()
    );
}
