//! The Kafka commands: `kafka reinject`, the library's
//! [`Reinjector`](babel_idem::transport::kafka::Reinjector) run until a
//! signal.

use babel_idem::transport::KafkaTransport;
use babel_idem::transport::kafka::{ReinjectError, Reinjector, RetryTiers};
use serde_json::json;

use crate::args::{KafkaCommand, ReinjectArgs};
use crate::exit::{CliError, Exit};
use crate::output::{Output, escaped};
use crate::units::positive_duration;

/// `--tiers`: ascending durations, comma separated (`5s,30s,5m`).
pub(crate) fn parse_tiers(text: &str) -> Result<RetryTiers, String> {
    let delays = text
        .split(',')
        .map(|tier| positive_duration(tier.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    RetryTiers::new(delays).map_err(|error| error.to_string())
}

pub(crate) async fn kafka(
    command: KafkaCommand,
    timeout: std::time::Duration,
    dry_run: bool,
    out: &mut Output,
) -> Result<Exit, CliError> {
    match command {
        KafkaCommand::Reinject(args) => reinject(args, timeout, dry_run, out).await,
    }
}

/// `kafka reinject`: re-injects until SIGTERM or Ctrl-C (a write under
/// way finishes first), then prints how many records it moved. With
/// `--dry-run` it connects, names the tier topics it would read, and
/// moves nothing.
async fn reinject(
    args: ReinjectArgs,
    timeout: std::time::Duration,
    dry_run: bool,
    out: &mut Output,
) -> Result<Exit, CliError> {
    let transport = KafkaTransport::builder()
        .timeout(timeout)
        .retry_tiers(args.tiers.clone())
        .connect(&args.kafka)
        .await
        .map_err(crate::dead_letters::transport_failed)?;
    let mut builder = Reinjector::builder().group(&args.group);
    for topic in &args.topics {
        builder = builder.topic(topic);
    }
    let reinjector = builder.build(&transport).map_err(reinject_failed)?;
    let topics = reinjector.topics().to_vec();
    if dry_run {
        out.emit(
            || {
                format!(
                    "would re-inject from {} (dry run: nothing moved)",
                    topics
                        .iter()
                        .map(|t| escaped(t).into_owned())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            },
            || json!({ "topics": topics, "reinjected": 0, "dry_run": true }),
        );
        return Ok(Exit::Ok);
    }
    tracing::info!(topics = ?topics, group = %args.group, "re-injecting until SIGTERM or Ctrl-C");
    let reinjected = reinjector.run(crate::outbox::terminated()).await;
    out.emit(
        || {
            format!(
                "re-injected {reinjected} records from {} tier topics",
                topics.len()
            )
        },
        || json!({ "topics": topics, "reinjected": reinjected, "dry_run": false }),
    );
    Ok(Exit::Ok)
}

fn reinject_failed(error: ReinjectError) -> CliError {
    let exit = match &error {
        ReinjectError::NoTopics | ReinjectError::NoTiers => Exit::Usage,
        ReinjectError::Start(_) => Exit::Connect,
        _ => Exit::Store,
    };
    CliError::new(exit, error.to_string())
}
