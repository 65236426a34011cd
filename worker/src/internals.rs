//! What the workspace's own crates, tests and benches reach that is not the worker's public API: the
//! dispatcher, KPL aggregates and the lease rows' format. Hidden from the docs, with no stability
//! promise; an embedder has no use for it.

/// The record dispatcher and runner (the dispatch benchmark drives them without a worker).
pub mod dispatch {
    pub use crate::dispatch::{
        DispatchSettings, Dispatcher, Envelope, History, Opened, RequeueKey, Runner, open_requeued, parse_requeued,
    };
}

/// KPL aggregated records: reading them (the CLI's import of KCL checkpoints) and making them (tests
/// and benches).
pub mod kpl {
    pub use crate::kpl::*;
}

/// The lease table's row format: attribute names, membership and term rows (the CLI reads and writes
/// rows; tests look at them).
pub mod lease {
    pub use crate::lease::row::{AttrValue, Attributes, MEMBER_PREFIX, TERM_PREFIX, attr, changes_key, term_key};
}

/// The http processor's answer reader: a pure function of the body's bytes (fuzz targets call it).
pub mod http {
    pub use crate::processor::http::{Answer, AnswerError, AnswerOutput, Failed, MAX_ANSWER_BYTES, parse_answer};
}

/// The multilang processor's message reader: a pure function of one line's bytes (fuzz targets call
/// it).
pub mod multilang {
    pub use crate::processor::multilang::{MAX_LINE_BYTES, Message, NotAMessage, parse_message};
}

/// Handoff notices: the signed format, for tests that send notices and for fuzz targets
/// ([`parse_notice`](handoff::parse_notice) reads a body with no signature, clock or membership).
pub mod handoff {
    pub use crate::coordinator::{
        HandoffNotice, HandoffSecret, MAX_BODY_BYTES, MAX_NOTICE_AGE, MAX_NOTICE_KEYS, NOTICE_PATH, Refusal,
        SIGNATURE_HEADER, SecretError, now_ms, parse_notice, sign_notice, verify_notice,
    };
}
