//! The dead-letter queue: its visible messages received (hidden while the run works on them), and
//! those not deleted made visible again.

use std::collections::HashSet;

use super::letter::{Copy, Verdict, take};
use super::{Run, Source};
use crate::shared::error::{CliError, Result};

/// Receives every visible message of `queue` (hidden for the visibility timeout while the run works);
/// the receipts of all, with whether each was chosen.
pub(super) async fn read_queue(run: &mut Run<'_>, queue: &str) -> Result<Vec<(String, bool)>> {
    let failed = |e: String| CliError::Service(format!("reading dead-letter queue {queue}: {e}"));
    let visibility = i32::try_from(run.args.visibility_timeout.as_secs()).unwrap_or(43_200).clamp(1, 43_200);
    let mut receipts = Vec::new();
    loop {
        if run.full() {
            break;
        }
        let out = run
            .sqs
            .receive_message()
            .queue_url(queue)
            .max_number_of_messages(10)
            .visibility_timeout(visibility)
            .wait_time_seconds(1)
            .message_system_attribute_names(aws_sdk_sqs::types::MessageSystemAttributeName::SentTimestamp)
            .send()
            .await
            .map_err(|e| failed(aws_sdk_sqs::error::DisplayErrorContext(&e).to_string()))?;
        let messages = out.messages.unwrap_or_default();
        if messages.is_empty() {
            break;
        }
        for message in messages {
            let (Some(receipt), Some(body)) = (message.receipt_handle, message.body) else { continue };
            let written = message
                .attributes
                .as_ref()
                .and_then(|a| a.get(&aws_sdk_sqs::types::MessageSystemAttributeName::SentTimestamp))
                .and_then(|t| t.parse::<i64>().ok());
            let copy = Copy::Sqs { receipt: receipt.clone() };
            let chosen = match run.judge(Source::Sqs, copy, body.as_bytes(), written).await? {
                Verdict::Take(pending) => {
                    take(run, pending);
                    true
                }
                Verdict::Never | Verdict::Later => false,
            };
            receipts.push((receipt, chosen));
        }
    }
    Ok(receipts)
}

/// Makes every received message not deleted visible again (all of them after a dry run; after
/// `--execute` those left out, refused, or not reached when the run stopped).
pub(super) async fn release(
    sqs: &aws_sdk_sqs::Client,
    queue: &str,
    receipts: &[(String, bool)],
    deleted: &HashSet<String>,
) -> Result<()> {
    for (receipt, _) in receipts {
        if deleted.contains(receipt) {
            continue;
        }
        let changed =
            sqs.change_message_visibility().queue_url(queue).receipt_handle(receipt).visibility_timeout(0).send().await;
        if let Err(e) = changed {
            // A deleted message's receipt no longer works: only other failures matter.
            let text = aws_sdk_sqs::error::DisplayErrorContext(&e).to_string();
            if !text.contains("ReceiptHandleIsInvalid") && !text.contains("MessageNotInflight") {
                return Err(CliError::Service(format!("making a message of {queue} visible again: {text}")));
            }
        }
    }
    Ok(())
}
