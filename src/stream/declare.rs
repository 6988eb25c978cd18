//! `outboxd streams declare`: the operator creates the streams the relay
//! publishes to, with their retention (the relay never creates one: a
//! row for a missing stream is refused, retried and parked).

use std::collections::HashMap;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::link::StreamLink;
use crate::config::Config;

#[derive(Debug, Clone, Subcommand)]
pub enum StreamsCommand {
    /// Create streams (every one of amqp.streams unless named); one that
    /// exists is left as it is
    Declare(DeclareArgs),
}

#[derive(Debug, Clone, Args)]
pub struct DeclareArgs {
    /// Stream names [default: amqp.streams]
    pub names: Vec<String>,
    /// Delete messages older than this, e.g. 7d, 12h (the stream's max-age)
    #[arg(long, value_name = "DURATION", value_parser = crate::config::parse_duration)]
    pub max_age: Option<Duration>,
    /// Delete the oldest segments beyond this many bytes
    #[arg(long, value_name = "BYTES")]
    pub max_length_bytes: Option<u64>,
    /// Size of one segment file [broker default: 500 MB]
    #[arg(long, value_name = "BYTES")]
    pub max_segment_size_bytes: Option<u64>,
}

/// Runs `outboxd streams …`.
pub async fn run(config: &Config, command: &StreamsCommand) -> anyhow::Result<()> {
    let StreamsCommand::Declare(args) = command;
    if config.amqp.stream_url.trim().is_empty() {
        anyhow::bail!("amqp.stream_url is empty: set it to the broker's stream port");
    }
    let names = match args.names.is_empty() {
        true => config.amqp.streams.clone(),
        false => args.names.clone(),
    };
    if names.is_empty() {
        anyhow::bail!("no stream to declare: name one, or list them in amqp.streams");
    }
    let link = StreamLink::new(&config.amqp)?;
    let client = link.client().await?;
    for name in names {
        let created = client.create_stream(&name, retention(args)).await?;
        say!(
            "{name}: {}",
            if created {
                "created"
            } else {
                "exists (left as it is)"
            }
        );
    }
    Ok(())
}

/// The stream arguments RabbitMQ names for the retention asked for.
fn retention(args: &DeclareArgs) -> HashMap<String, String> {
    let mut arguments = HashMap::new();
    if let Some(age) = args.max_age {
        arguments.insert("max-age".into(), format!("{}s", age.as_secs().max(1)));
    }
    if let Some(bytes) = args.max_length_bytes {
        arguments.insert("max-length-bytes".into(), bytes.to_string());
    }
    if let Some(bytes) = args.max_segment_size_bytes {
        arguments.insert("stream-max-segment-size-bytes".into(), bytes.to_string());
    }
    arguments
}
