//! Reading a receiver's 2xx answer body: a pure function of its bytes ([`parse_answer`], fuzzed), then
//! applied to the request's record or batch by the caller. The rules are in the parent module's docs
//! and in docs/worker.md ("What an answer means").

use base64::Engine;
use serde_json::{Map, Value};

use crate::processor::ProcessError;
use crate::processor::foreign;

/// The longest answer read, in bytes (Lambda's 6 MB synchronous payload): a longer one fails the call.
pub const MAX_ANSWER_BYTES: usize = 6 * 1024 * 1024;

/// Why a 2xx answer cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// It starts like JSON (`{` or `[`) but does not parse: cut, or malformed.
    #[error("the answer starts like JSON but is not JSON ({0}); it may have been cut")]
    Malformed(String),
    /// A list member (`failed`, `outputs`, `batchItemFailures`) is something else.
    #[error("`{0}` in the answer is not a list")]
    NotAList(&'static str),
    /// An output has no `data`, or `data` is not base64.
    #[error("an output in the answer has no base64 `data`")]
    NoData,
    /// An entry of `batchItemFailures` has no `itemIdentifier`, a null or empty one, or one that is
    /// not a string (Lambda's "complete failure" cases).
    #[error("an entry of batchItemFailures has no usable itemIdentifier")]
    NoItemIdentifier,
}

impl AnswerError {
    /// True when sending again may help: a cut answer may arrive whole, and Lambda retries a batch
    /// whose `batchItemFailures` it cannot read. A receiver naming things wrongly will do it again.
    pub fn retryable(&self) -> bool {
        matches!(self, Self::Malformed(_) | Self::NotAList("batchItemFailures") | Self::NoItemIdentifier)
    }

    /// The error failing the call (or every record of the batch).
    pub(crate) fn into_process_error(self, whole: &str) -> ProcessError {
        let message = format!("{self}: {whole} failed");
        if self.retryable() { ProcessError::retryable(message) } else { ProcessError::permanent(message) }
    }
}

/// What a 2xx answer says, before it is matched to the records it names.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Answer {
    /// `failed`: events that failed.
    pub failed: Vec<Failed>,
    /// `outputs`: records to publish.
    pub outputs: Vec<AnswerOutput>,
    /// `batchItemFailures[].itemIdentifier` (Lambda's shape): sequence numbers or event ids.
    pub item_failures: Vec<String>,
}

/// An entry of `failed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    /// The event it names (`id`), if any.
    pub id: Option<String>,
    /// The event's `source`, where ids repeat across streams.
    pub source: Option<String>,
    /// Whether to retry it (`retryable`, default true).
    pub retryable: bool,
    /// Why (`error`).
    pub error: Option<String>,
}

/// An entry of `outputs`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnswerOutput {
    /// The event it belongs to (`id`; batches only).
    pub id: Option<String>,
    /// The event's `source`, where ids repeat across streams.
    pub source: Option<String>,
    /// The decoded `data`.
    pub data: Vec<u8>,
    /// `partitionKey`.
    pub partition_key: Option<String>,
    /// `carryPartitionKey`.
    pub carry_partition_key: bool,
}

/// Reads a 2xx answer body. Empty (or blank) and plain text (anything not starting with `{` or `[`)
/// acknowledge everything; so does JSON that is not an object. A body starting like JSON must parse.
pub fn parse_answer(body: &[u8]) -> Result<Answer, AnswerError> {
    let Some(&first) = body.iter().find(|b| !b.is_ascii_whitespace()) else { return Ok(Answer::default()) };
    if first != b'{' && first != b'[' {
        return Ok(Answer::default());
    }
    let value =
        serde_json::from_slice::<Value>(body).map_err(|e| AnswerError::Malformed(foreign::short(&e.to_string())))?;
    let Value::Object(answer) = value else { return Ok(Answer::default()) };
    let text = |item: &Value, name: &str| item.get(name).and_then(Value::as_str).map(str::to_string);
    let mut read = Answer::default();
    for item in list(&answer, "outputs")? {
        let data = item
            .get("data")
            .and_then(Value::as_str)
            .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
            .ok_or(AnswerError::NoData)?;
        read.outputs.push(AnswerOutput {
            id: text(item, "id"),
            source: text(item, "source"),
            data,
            partition_key: text(item, "partitionKey"),
            carry_partition_key: item.get("carryPartitionKey").and_then(Value::as_bool) == Some(true),
        });
    }
    for item in list(&answer, "failed")? {
        read.failed.push(Failed {
            id: text(item, "id"),
            source: text(item, "source"),
            retryable: item.get("retryable").and_then(Value::as_bool).unwrap_or(true),
            error: text(item, "error"),
        });
    }
    for item in list(&answer, "batchItemFailures")? {
        let id = text(item, "itemIdentifier").filter(|id| !id.is_empty()).ok_or(AnswerError::NoItemIdentifier)?;
        read.item_failures.push(id);
    }
    Ok(read)
}

/// The entries of `answer[name]`: none when absent or null, an error when it is not a list.
fn list<'a>(answer: &'a Map<String, Value>, name: &'static str) -> Result<&'a [Value], AnswerError> {
    match answer.get(name) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(AnswerError::NotAList(name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_plain_text_and_non_object_json_acknowledge_everything() {
        for body in [&b""[..], b"  \n", b"OK", b"accepted\n", b"null", b"42", b"\"done\"", b"[]", b"[1, 2]", b"{}"] {
            assert_eq!(parse_answer(body), Ok(Answer::default()), "{:?}", String::from_utf8_lossy(body));
        }
        // Lambda's complete-success cases: an empty or null list, an empty or null response.
        for body in [r#"{"batchItemFailures": []}"#, r#"{"batchItemFailures": null}"#, "{}", "null"] {
            assert_eq!(parse_answer(body.as_bytes()), Ok(Answer::default()), "{body}");
        }
    }

    #[test]
    fn an_answer_starting_like_json_must_parse() {
        for body in [
            r#"{"batchItemFailures": [{"itemIdentifier": "4959"#,
            r#"{"failed": [{"id": "a"}]"#,
            "{",
            " [1, 2",
            r#"{"outputs": [] } trailing"#,
        ] {
            let error = parse_answer(body.as_bytes()).expect_err(body);
            assert!(matches!(error, AnswerError::Malformed(_)) && error.retryable(), "{body}: {error:?}");
        }
    }

    #[test]
    fn lambda_complete_failures_are_retryable() {
        for body in [
            r#"{"batchItemFailures": [{"itemIdentifier": ""}]}"#,
            r#"{"batchItemFailures": [{"itemIdentifier": null}]}"#,
            r#"{"batchItemFailures": [{"itemIdentifer": "4959"}]}"#,
            r#"{"batchItemFailures": [{"itemIdentifier": 4959}]}"#,
            r#"{"batchItemFailures": ["4959"]}"#,
            r#"{"batchItemFailures": {"itemIdentifier": "4959"}}"#,
        ] {
            let error = parse_answer(body.as_bytes()).expect_err(body);
            assert!(error.retryable(), "{body}: {error:?}");
        }
        let named = parse_answer(br#"{"batchItemFailures": [{"itemIdentifier": "1"}, {"itemIdentifier": "2"}]}"#);
        assert_eq!(named.map(|a| a.item_failures), Ok(vec!["1".to_string(), "2".to_string()]));
    }

    #[test]
    fn misnamed_entries_of_our_own_shape_are_permanent() {
        for (body, expected) in [
            (r#"{"failed": {"id": "a"}}"#, AnswerError::NotAList("failed")),
            (r#"{"outputs": "x"}"#, AnswerError::NotAList("outputs")),
            (r#"{"outputs": [{"id": "a", "data": "not base64!"}]}"#, AnswerError::NoData),
            (r#"{"outputs": [{"id": "a"}]}"#, AnswerError::NoData),
        ] {
            let error = parse_answer(body.as_bytes()).expect_err(body);
            assert_eq!(error, expected);
            assert!(!error.retryable(), "{body}");
        }
    }

    #[test]
    fn entries_are_read_with_their_defaults() {
        let body = r#"{"failed": [{"id": "a", "source": "kinesis:s"}, {"id": "b", "retryable": false, "error": "bad"}],
            "outputs": [{"id": "a", "data": "b25l", "partitionKey": "k"}, {"data": "dHdv", "carryPartitionKey": true}]}"#;
        let answer = parse_answer(body.as_bytes()).expect("readable");
        assert_eq!(answer.failed.len(), 2);
        assert!(answer.failed[0].retryable && answer.failed[0].source.as_deref() == Some("kinesis:s"));
        assert!(!answer.failed[1].retryable && answer.failed[1].error.as_deref() == Some("bad"));
        assert_eq!(answer.outputs[0].data, b"one");
        assert_eq!(answer.outputs[0].partition_key.as_deref(), Some("k"));
        assert!(answer.outputs[1].id.is_none() && answer.outputs[1].carry_partition_key);
    }

    #[test]
    fn a_parse_error_is_cut_to_a_sane_length() {
        let mut body = b"{\"failed\": [\"".to_vec();
        body.extend(std::iter::repeat_n(b'x', 1_000_000));
        let error = parse_answer(&body).expect_err("cut");
        assert!(error.to_string().len() < 1000, "{}", error.to_string().len());
    }
}
