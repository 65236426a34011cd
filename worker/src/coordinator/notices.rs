//! Handoff notices: a worker shutting down tells the peers it frees its leases for, over their notice
//! endpoints, which rows it released, so they take them at once instead of at their next scan (up to
//! a scan interval later). A notice is only a hint: the peer reads each row and takes it if it is
//! free, as a scan would; a notice lost on the way leaves the row to the scans, as before notices.
//!
//! The endpoint is its own port (so a NetworkPolicy can open it to the group alone) and trusts
//! nothing it is sent. A notice is signed: `x-leasehold-signature: v1=<hex HMAC-SHA256 of the body>`
//! under the consumer's secret, and its body carries the time it was sent, so a copy is refused
//! after [`MAX_NOTICE_AGE`] (and a second copy within it). The body is at most [`MAX_BODY_BYTES`], one
//! sender and at most [`MAX_NOTICE_KEYS`] shard rows (never a `#` row of the group). The coordinator
//! takes a notice only from a member it saw alive, only rows of its own streams, and at most its fair
//! share. Without a secret, notices are off: none is sent, the endpoint is not served, the scans do
//! the work. Every refusal is counted (`leasehold_handoff_notices_total{event="refused",reason}`), its
//! log line written at most once per reason every 10 s, with foreign text cut.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
#[cfg(feature = "cli")]
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use hmac::{Hmac, Mac};
#[cfg(feature = "cli")]
use http::StatusCode;
use http::{Request, header};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::Coordinator;
use super::balance;
use crate::discovery::StreamSelection;
use crate::health::{LogThrottle, clip};
use crate::lease::{Lease, LeaseKey, Member};
use crate::metrics::Metrics;

/// Path of the endpoint that takes notices, on the handoff port.
pub const NOTICE_PATH: &str = "/v1/handoff";

/// Header carrying a notice's signature: `v1=<hex HMAC-SHA256 of the body under the secret>`.
pub const SIGNATURE_HEADER: &str = "x-leasehold-signature";

/// Largest notice body taken (a notice names one row; a few rows fit with room to spare).
pub const MAX_BODY_BYTES: usize = 4 * 1024;

/// Most rows one notice may name.
pub const MAX_NOTICE_KEYS: usize = 16;

/// How far a notice's `sent_ms` may be from this worker's clock (either way) to be taken.
pub const MAX_NOTICE_AGE: Duration = Duration::from_secs(30);

/// Shortest secret taken, in bytes.
pub const MIN_SECRET_BYTES: usize = 16;

/// Longest sender name and row key in a notice (owner ids are at most 256 bytes; a key is a stream
/// name of at most 128 characters and a shard id).
const MAX_FIELD_BYTES: usize = 256;

/// Characters of foreign text (a sender, a key) a log line carries.
const LOG_CHARS: usize = 100;

/// How long a releasing worker waits for a peer to take a notice: a notice later than a scan
/// interval is worth nothing.
const SEND_TIMEOUT: Duration = Duration::from_millis(500);

/// Notices waiting for the coordinator; more are refused (the scans find the rows anyway).
#[cfg(feature = "cli")]
const INBOX_CAPACITY: usize = 64;

/// Signatures of notices taken within [`MAX_NOTICE_AGE`] kept to refuse copies; past this many,
/// new notices are refused as busy until old ones age out.
#[cfg(feature = "cli")]
const REPLAY_MEMORY: usize = 4096;

type HmacSha256 = Hmac<Sha256>;

/// What a releasing worker tells a peer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HandoffNotice {
    /// The releasing worker.
    pub from: String,
    /// When it was sent (ms since the Unix epoch, the sender's clock).
    pub sent_ms: u64,
    /// The rows it freed for this peer, as `lease_key` text.
    pub leases: Vec<String>,
}

/// The consumer's notice secret: every worker of the group signs and checks notices with it.
#[derive(Clone)]
pub struct HandoffSecret(Arc<[u8]>);

impl std::fmt::Debug for HandoffSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HandoffSecret(..)")
    }
}

/// Why a secret is not taken.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The file cannot be read.
    #[error("cannot read the handoff secret file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The secret is too short to sign with.
    #[error("the handoff secret is {0} bytes; at least {MIN_SECRET_BYTES} are needed")]
    TooShort(usize),
}

impl HandoffSecret {
    /// `bytes` as a secret (surrounding whitespace, such as a file's last newline, is not part of it).
    pub fn new(bytes: &[u8]) -> Result<Self, SecretError> {
        let bytes = bytes.trim_ascii();
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort(bytes.len()));
        }
        Ok(Self(bytes.into()))
    }

    /// The secret in the file at `path` (a mounted Secret's key).
    pub fn from_file(path: &std::path::Path) -> Result<Self, SecretError> {
        let bytes =
            std::fs::read(path).map_err(|source| SecretError::Read { path: path.display().to_string(), source })?;
        Self::new(&bytes)
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes keys of any length.
        <HmacSha256 as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!("HMAC takes any key length"))
    }

    /// The signature header's value for `body`.
    pub fn sign(&self, body: &[u8]) -> String {
        let mut mac = self.mac();
        mac.update(body);
        format!("v1={}", hex::encode(mac.finalize().into_bytes()))
    }

    /// The MAC in `signature` (the header's value) if it is `body`'s under this secret, checked in
    /// constant time.
    fn verify(&self, body: &[u8], signature: &str) -> Result<[u8; 32], Refusal> {
        let tag = signature.trim().strip_prefix("v1=").ok_or(Refusal::BadSignature)?;
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(tag, &mut bytes).map_err(|_| Refusal::BadSignature)?;
        let mut mac = self.mac();
        mac.update(body);
        mac.verify_slice(&bytes).map_err(|_| Refusal::BadSignature)?;
        Ok(bytes)
    }
}

/// Why a notice (or one of its rows) is not taken; the text is safe to log (foreign parts cut).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No signature header.
    #[error("unsigned")]
    Unsigned,
    /// A signature that is not the body's under the consumer's secret.
    #[error("wrong signature")]
    BadSignature,
    /// A body that is not a notice.
    #[error("not a notice: {0}")]
    Malformed(String),
    /// Sent too long ago (or too far ahead) to be taken.
    #[error("sent {0} ms away from this worker's clock")]
    Stale(i64),
    /// A signed notice taken before.
    #[error("a copy of a notice already taken")]
    Replayed,
    /// More rows than one notice may name.
    #[error("{0} rows in one notice; at most {MAX_NOTICE_KEYS}")]
    TooManyKeys(usize),
    /// A row of the group itself (membership, terms), never a lease to take.
    #[error("group row {0}")]
    GroupRow(String),
    /// Not `<stream>:<shardId>`.
    #[error("no lease row: {0}")]
    BadKey(String),
    /// The sender is not a member this worker saw alive.
    #[error("sender {0} is not a live member")]
    NotMember(String),
    /// A row of a stream this consumer does not read.
    #[error("row {0} of another stream")]
    ForeignStream(String),
    /// Beyond this worker's fair share: left to the scans.
    #[error("row {0} beyond this worker's fair share")]
    OverShare(String),
    /// The coordinator takes no more notices now.
    #[error("not taking notices now")]
    Busy,
    /// A body over [`MAX_BODY_BYTES`] (or one that could not be read).
    #[error("body refused: {0}")]
    TooLarge(String),
}

impl Refusal {
    /// The `reason` label of the refusal's count.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::Unsigned => "unsigned",
            Refusal::BadSignature => "bad_signature",
            Refusal::Malformed(_) => "malformed",
            Refusal::Stale(_) => "stale",
            Refusal::Replayed => "replayed",
            Refusal::TooManyKeys(_) => "too_many_keys",
            Refusal::GroupRow(_) => "group_row",
            Refusal::BadKey(_) => "bad_key",
            Refusal::NotMember(_) => "not_member",
            Refusal::ForeignStream(_) => "foreign_stream",
            Refusal::OverShare(_) => "over_share",
            Refusal::Busy => "busy",
            Refusal::TooLarge(_) => "too_large",
        }
    }

    #[cfg(feature = "cli")]
    fn status(&self) -> StatusCode {
        match self {
            Refusal::Unsigned | Refusal::BadSignature | Refusal::Stale(_) | Refusal::Replayed => {
                StatusCode::UNAUTHORIZED
            }
            Refusal::Busy => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::NotMember(_) | Refusal::ForeignStream(_) | Refusal::OverShare(_) => StatusCode::FORBIDDEN,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// Reads a notice body: one sender (at most 256 bytes), the time it was sent, and 1 to
/// [`MAX_NOTICE_KEYS`] shard rows as `<stream>:<shardId>` (at most 256 bytes each, never a `#` row).
/// Pure (no signature, clock or membership), for the endpoint and for fuzzing.
pub fn parse_notice(body: &[u8]) -> Result<HandoffNotice, Refusal> {
    if body.len() > MAX_BODY_BYTES {
        return Err(Refusal::Malformed(format!("{} bytes; at most {MAX_BODY_BYTES}", body.len())));
    }
    let notice: HandoffNotice =
        serde_json::from_slice(body).map_err(|e| Refusal::Malformed(clip(&e.to_string(), LOG_CHARS)))?;
    if notice.from.is_empty() || notice.from.len() > MAX_FIELD_BYTES {
        return Err(Refusal::Malformed(format!("a sender of {} bytes", notice.from.len())));
    }
    if notice.leases.is_empty() {
        return Err(Refusal::Malformed("no rows".into()));
    }
    if notice.leases.len() > MAX_NOTICE_KEYS {
        return Err(Refusal::TooManyKeys(notice.leases.len()));
    }
    for key in &notice.leases {
        if key.starts_with('#') {
            return Err(Refusal::GroupRow(clip(key, LOG_CHARS)));
        }
        if key.len() > MAX_FIELD_BYTES || LeaseKey::parse(key).is_none() {
            return Err(Refusal::BadKey(clip(key, LOG_CHARS)));
        }
    }
    Ok(notice)
}

/// Checks a notice as the endpoint does before the coordinator sees it: `signature` (the header's
/// value) is the body's under `secret`, the body is a notice ([`parse_notice`]) and it was sent within
/// [`MAX_NOTICE_AGE`] of `now_ms`. Returns the notice and its MAC (to refuse copies by).
pub fn verify_notice(
    body: &[u8],
    signature: Option<&str>,
    secret: &HandoffSecret,
    now_ms: u64,
) -> Result<(HandoffNotice, [u8; 32]), Refusal> {
    let mac = secret.verify(body, signature.ok_or(Refusal::Unsigned)?)?;
    let notice = parse_notice(body)?;
    let away =
        i64::try_from(now_ms).unwrap_or(i64::MAX).saturating_sub(i64::try_from(notice.sent_ms).unwrap_or(i64::MAX));
    if away.unsigned_abs() > MAX_NOTICE_AGE.as_millis() as u64 {
        return Err(Refusal::Stale(away));
    }
    Ok((notice, mac))
}

/// The signed request body and signature header value of `notice`.
pub fn sign_notice(notice: &HandoffNotice, secret: &HandoffSecret) -> Result<(Vec<u8>, String), serde_json::Error> {
    let body = serde_json::to_vec(notice)?;
    let signature = secret.sign(&body);
    Ok((body, signature))
}

/// Milliseconds since the Unix epoch now.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Counts every refusal and logs it, at most once per reason every 10 s (with how many were left
/// out): shared by the endpoint and the coordinator.
#[derive(Debug)]
pub struct Refusals {
    metrics: Arc<Metrics>,
    throttle: LogThrottle,
}

impl Refusals {
    /// Refusals counted into `metrics` (made by the endpoint's inbox, which the `cli` feature serves).
    #[cfg(feature = "cli")]
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics, throttle: LogThrottle::new(Duration::from_secs(10)) }
    }

    /// Counts `refusal`, and logs it unless a line for its reason was written in the last 10 s.
    pub fn refuse(&self, refusal: &Refusal) {
        let reason = refusal.reason();
        self.metrics.handoff_refused(reason);
        if let Some(left_out) = self.throttle.allow(reason) {
            if matches!(refusal, Refusal::OverShare(_) | Refusal::Busy) {
                tracing::debug!(reason, detail = %refusal, left_out, "handoff notice refused");
            } else {
                tracing::warn!(reason, detail = %refusal, left_out, "handoff notice refused");
            }
        }
    }
}

/// The coordinator's end of the notice endpoint, the address peers reach that endpoint at, and the
/// secret notices are signed with.
#[derive(Debug)]
pub struct HandoffInbox {
    pub(super) notices: mpsc::Receiver<HandoffNotice>,
    /// `host:port` written into this worker's membership row; `None` leaves peers to the scans.
    pub(crate) address: Option<String>,
    pub(super) secret: HandoffSecret,
    pub(super) refusals: Arc<Refusals>,
    pub(super) streams: Option<StreamSelection>,
}

impl HandoffInbox {
    /// The same inbox taking rows of `streams` only (the consumer's selection).
    pub(crate) fn for_streams(mut self, streams: StreamSelection) -> Self {
        self.streams = Some(streams);
        self
    }
}

/// What the endpoint checks notices with before queueing them for the coordinator.
#[cfg(feature = "cli")]
#[derive(Clone)]
pub struct NoticeGate {
    sender: mpsc::Sender<HandoffNotice>,
    secret: HandoffSecret,
    refusals: Arc<Refusals>,
    /// MACs of notices taken, with when each was sent.
    taken: Arc<Mutex<HashMap<[u8; 32], u64>>>,
}

/// A notice inbox advertised at `address` under `secret`, and the gate its endpoint fills it through;
/// refusals are counted into `metrics`.
#[cfg(feature = "cli")]
pub fn inbox(address: Option<String>, secret: HandoffSecret, metrics: Arc<Metrics>) -> (HandoffInbox, NoticeGate) {
    let (sender, notices) = mpsc::channel(INBOX_CAPACITY);
    let refusals = Arc::new(Refusals::new(metrics));
    let gate = NoticeGate { sender, secret: secret.clone(), refusals: refusals.clone(), taken: Arc::default() };
    (HandoffInbox { notices, address, secret, refusals, streams: None }, gate)
}

/// The router of the notice endpoint (`POST` [`NOTICE_PATH`]), bodies over [`MAX_BODY_BYTES`]
/// refused (413), to serve on the handoff port alone.
#[cfg(feature = "cli")]
pub fn route(gate: NoticeGate) -> axum::Router {
    axum::Router::new()
        .route(NOTICE_PATH, axum::routing::post(receive))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(gate)
}

/// The server limits of the handoff port: only peers of the group talk to it, with small bodies.
#[cfg(feature = "cli")]
pub fn server_limits() -> crate::health::ServerLimits {
    crate::health::ServerLimits {
        header_read_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(2),
        max_connections: 128,
        max_body_bytes: MAX_BODY_BYTES,
        max_connection_age: Duration::from_secs(60),
    }
}

#[cfg(feature = "cli")]
impl NoticeGate {
    /// Answers a notice: 202 once queued for the coordinator; otherwise the refusal's status (401 for
    /// an unsigned, wrongly signed, stale or copied notice, 400 for a body that is not a notice, 503
    /// when the coordinator takes no more), each refusal counted.
    fn answer(&self, signature: Option<&str>, body: &[u8], now_ms: u64) -> (StatusCode, &'static str) {
        match self.admit(signature, body, now_ms) {
            Ok(()) => (StatusCode::ACCEPTED, "accepted"),
            Err(refusal) => {
                self.refusals.refuse(&refusal);
                (refusal.status(), refusal.reason())
            }
        }
    }

    fn admit(&self, signature: Option<&str>, body: &[u8], now_ms: u64) -> Result<(), Refusal> {
        let (notice, mac) = verify_notice(body, signature, &self.secret, now_ms)?;
        {
            let mut taken = self.taken.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if taken.contains_key(&mac) {
                return Err(Refusal::Replayed);
            }
            if taken.len() >= REPLAY_MEMORY {
                let horizon = MAX_NOTICE_AGE.as_millis() as u64;
                taken.retain(|_, sent| now_ms.abs_diff(*sent) <= horizon);
                if taken.len() >= REPLAY_MEMORY {
                    return Err(Refusal::Busy);
                }
            }
            taken.insert(mac, notice.sent_ms);
        }
        self.sender.try_send(notice).map_err(|_| Refusal::Busy)
    }
}

#[cfg(feature = "cli")]
async fn receive(
    axum::extract::State(gate): axum::extract::State<NoticeGate>,
    headers: http::HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> (StatusCode, &'static str) {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let refusal = Refusal::TooLarge(clip(&rejection.body_text(), LOG_CHARS));
            gate.refusals.refuse(&refusal);
            return (rejection.status(), refusal.reason());
        }
    };
    let signature = headers.get(SIGNATURE_HEADER).and_then(|v| v.to_str().ok());
    gate.answer(signature, &body, now_ms())
}

/// A live peer that takes notices, with the leases it held when the table was last read.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Peer {
    owner: String,
    address: String,
    held: usize,
}

/// The peers a leaving worker may free its leases for, from the last view of the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Peers(Vec<Peer>);

impl Peers {
    /// The live members other than `me` that advertise an address and are not draining, with their
    /// lease counts in `leases`.
    pub(super) fn from_view(leases: &[Lease], members: &[Member], me: &str) -> Self {
        let mut held: HashMap<&str, usize> = HashMap::new();
        for owner in leases.iter().filter_map(|l| l.owner.as_deref()) {
            *held.entry(owner).or_default() += 1;
        }
        let mut peers: Vec<Peer> = members
            .iter()
            .filter(|m| m.alive && m.owner != me && !m.draining)
            .filter_map(|m| {
                let address = m.address.clone()?;
                Some(Peer { owner: m.owner.clone(), held: held.get(m.owner.as_str()).copied().unwrap_or(0), address })
            })
            .collect();
        peers.sort_by(|a, b| a.owner.cmp(&b.owner));
        Self(peers)
    }

    /// Which peer each of `keys` is freed for: one at a time to the least loaded, so the leaver's
    /// leases spread the way the balance would spread them. Empty when no peer takes notices.
    pub(super) fn assign(&self, keys: impl IntoIterator<Item = LeaseKey>) -> HashMap<LeaseKey, String> {
        let mut load: Vec<(usize, &Peer)> = self.0.iter().map(|p| (p.held, p)).collect();
        let mut assigned = HashMap::new();
        if load.is_empty() {
            return assigned;
        }
        let mut keys: Vec<LeaseKey> = keys.into_iter().collect();
        keys.sort();
        for key in keys {
            let Some(least) = load.iter_mut().min_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.owner.cmp(&b.1.owner)))
            else {
                break;
            };
            least.0 += 1;
            assigned.insert(key, least.1.address.clone());
        }
        assigned
    }
}

/// What the coordinator keeps for notices: the inbox it takes them from (none when this worker
/// serves no endpoint or has no secret), the peers it would free its leases for, the group as its last
/// plan saw it (to judge senders and shares), and the sender.
#[derive(Default)]
pub(super) struct Handoffs {
    pub(super) inbox: Option<HandoffInbox>,
    pub(super) peers: Peers,
    pub(super) sender: NoticeSender,
    /// Members seen alive, with when they were last seen so: a leaver may leave the table before its
    /// notices arrive, so a member counts for a lease duration after it was last seen.
    pub(super) seen_alive: HashMap<String, Instant>,
    /// The workers sharing the leases at the last plan, and the active rows they share.
    pub(super) sharing: (Vec<String>, usize),
}

impl Handoffs {
    /// The next notice; never, without an inbox.
    pub(super) async fn next(&mut self) -> Option<HandoffNotice> {
        match &mut self.inbox {
            Some(inbox) => inbox.notices.recv().await,
            None => std::future::pending().await,
        }
    }

    /// Takes in a plan's view: who is alive (forgotten `remember` after last seen so), who shares the
    /// leases and how many rows they share.
    pub(super) fn observe(&mut self, leases: &[Lease], members: &[Member], me: &str, remember: Duration) {
        let now = Instant::now();
        for member in members.iter().filter(|m| m.alive) {
            self.seen_alive.insert(member.owner.clone(), now);
        }
        self.seen_alive.retain(|_, at| now.duration_since(*at) <= remember);
        self.sharing = (balance::sharing(me, members).1, balance::active(leases).len());
    }

    /// This worker's fair share once `leaver` is gone (a notice's sender is leaving), less what it
    /// runs: how many noticed rows it may take.
    fn allowance(&self, me: &str, leaver: &str, running: usize) -> usize {
        let (workers, rows) = &self.sharing;
        let staying: Vec<String> = workers.iter().filter(|w| *w != leaver).cloned().collect();
        balance::targets(*rows, &staying).get(me).copied().unwrap_or(0).saturating_sub(running)
    }
}

/// Sends notices to peers' endpoints, signed with the consumer's secret; without one, none is sent.
#[derive(Clone)]
pub(super) struct NoticeSender {
    client: Client<HttpConnector, Full<Bytes>>,
    pub(super) secret: Option<HandoffSecret>,
}

impl Default for NoticeSender {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(SEND_TIMEOUT));
        Self { client: Client::builder(TokioExecutor::new()).build(connector), secret: None }
    }
}

impl NoticeSender {
    /// Tells the peer at `address` that `notice`'s rows are free for it; the error says why it did not
    /// take the notice (the rows are then found by the scans).
    pub(super) async fn send(&self, address: &str, notice: &HandoffNotice) -> Result<(), String> {
        let secret = self.secret.as_ref().ok_or("no handoff secret")?;
        let (body, signature) = sign_notice(notice, secret).map_err(|e| e.to_string())?;
        let request = Request::post(format!("http://{address}{NOTICE_PATH}"))
            .header(header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(SEND_TIMEOUT, self.client.request(request)).await {
            Ok(Ok(response)) if response.status().is_success() => Ok(()),
            Ok(Ok(response)) => Err(format!("answered {}", response.status())),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {SEND_TIMEOUT:?}")),
        }
    }
}

impl Coordinator {
    /// Takes the rows a leaving peer freed for this worker, each if the table shows it free (it may
    /// have been taken by a scan meanwhile) and its parents finished: only from a member seen alive,
    /// only rows of this consumer's streams, and no more than this worker's fair share once the
    /// sender is gone (one consistent read per row taken at most, so a notice costs little).
    pub(super) async fn take_noticed(&mut self, notice: HandoffNotice) {
        let Some(inbox) = &self.handoffs.inbox else { return };
        let refusals = inbox.refusals.clone();
        if notice.from == self.owner() || !self.handoffs.seen_alive.contains_key(&notice.from) {
            refusals.refuse(&Refusal::NotMember(clip(&notice.from, LOG_CHARS)));
            return;
        }
        let streams = inbox.streams.clone();
        self.metrics().handoff_noticed("received");
        tracing::info!(from = notice.from, leases = notice.leases.len(), "handoff notice received");
        // A draining worker takes nothing, however it hears of a free row (its last plan said so).
        if !self.role.is_member() || self.share.draining {
            return;
        }
        let mut allowance =
            self.handoffs.allowance(self.owner(), &notice.from, self.running.len() + self.requested.len());
        let mut seen = HashSet::new();
        for text in notice.leases {
            // Checked by the endpoint already; a key that is not one is never read.
            let Some(key) = LeaseKey::parse(&text).filter(|_| !text.starts_with('#')) else {
                refusals.refuse(&Refusal::BadKey(clip(&text, LOG_CHARS)));
                continue;
            };
            if !seen.insert(key.clone()) || self.running.contains_key(&key) {
                continue;
            }
            if !streams.as_ref().is_some_and(|s| s.covers(key.stream())) {
                refusals.refuse(&Refusal::ForeignStream(clip(&text, LOG_CHARS)));
                continue;
            }
            if allowance == 0 {
                refusals.refuse(&Refusal::OverShare(clip(&text, LOG_CHARS)));
                continue;
            }
            allowance -= 1;
            let row = match self.store.get(&key).await {
                Ok(Some(row)) if row.owner.is_none() && !row.checkpoint.is_shard_end() => row,
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(shard = %key, error = %e, "noticed row not read; the scans will find it");
                    continue;
                }
            };
            if self.parents_done_now(&row).await {
                tracing::info!(shard = %key, from = notice.from, "lease freed for this worker by its holder; taking it");
                self.metrics().handoff_noticed("taken");
                self.take(row).await;
            }
        }
    }

    /// Which peer each held lease is freed for at shutdown (see [`Peers::assign`]); none without a
    /// secret to sign notices with.
    pub(super) fn notice_plan(&self) -> HashMap<LeaseKey, String> {
        if !self.role.is_member() || self.handoffs.sender.secret.is_none() {
            return HashMap::new();
        }
        self.handoffs.peers.assign(self.running.keys().cloned())
    }

    /// Tells the peer at `address` that `key` is free, on `sending` (awaited before the process ends).
    pub(super) fn notify(&self, key: &LeaseKey, address: String, sending: &mut JoinSet<()>) {
        let notice = HandoffNotice { from: self.owner().to_string(), sent_ms: now_ms(), leases: vec![key.to_string()] };
        let (sender, metrics) = (self.handoffs.sender.clone(), self.metrics().clone());
        sending.spawn(async move {
            match sender.send(&address, &notice).await {
                Ok(()) => metrics.handoff_noticed("sent"),
                Err(reason) => {
                    metrics.handoff_noticed("unsent");
                    tracing::debug!(peer = address, reason, "handoff notice not taken; the scans find the row");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(shard: usize, owner: Option<&str>) -> Lease {
        super::super::balance::test_lease(shard, owner)
    }

    fn member(owner: &str, address: Option<&str>, alive: bool) -> Member {
        Member {
            owner: owner.into(),
            counter: 1,
            alive,
            address: address.map(str::to_string),
            draining: false,
            expiry_ms: None,
        }
    }

    fn secret() -> HandoffSecret {
        HandoffSecret::new(b"a test secret of the group\n").expect("secret")
    }

    fn notice(from: &str, sent_ms: u64, leases: &[&str]) -> HandoffNotice {
        HandoffNotice { from: from.into(), sent_ms, leases: leases.iter().map(|l| l.to_string()).collect() }
    }

    const NOW: u64 = 1_800_000_000_000;

    #[test]
    fn leases_go_to_the_least_loaded_peers_first() {
        let leases = [lease(0, Some("me")), lease(1, Some("me")), lease(2, Some("me")), lease(3, Some("a"))];
        let members = [member("me", Some("m:1"), true), member("a", Some("a:1"), true), member("b", Some("b:1"), true)];
        let peers = Peers::from_view(&leases, &members, "me");
        let assigned = peers.assign(leases[..3].iter().map(|l| l.key.clone()));
        let to = |address: &str| assigned.values().filter(|a| *a == address).count();
        // b held none and a one: b takes two, a one, so both end with two.
        assert_eq!((to("a:1"), to("b:1"), assigned.len()), (1, 2, 3));
    }

    #[test]
    fn silent_or_draining_members_and_members_without_an_address_get_nothing() {
        let leases = [lease(0, Some("me"))];
        let members = [
            member("a", None, true),
            member("b", Some("b:1"), false),
            Member { draining: true, ..member("c", Some("c:1"), true) },
        ];
        let peers = Peers::from_view(&leases, &members, "me");
        assert!(peers.assign([leases[0].key.clone()]).is_empty());
    }

    #[test]
    fn a_signed_fresh_notice_is_taken() {
        let sent = notice("peer", NOW - 1_000, &["s:shardId-000000000001"]);
        let (body, signature) = sign_notice(&sent, &secret()).expect("signed");
        let (taken, _) = verify_notice(&body, Some(&signature), &secret(), NOW).expect("taken");
        assert_eq!(taken, sent);
    }

    #[test]
    fn unsigned_wrongly_signed_and_stale_notices_are_refused() {
        let sent = notice("peer", NOW, &["s:shardId-000000000001"]);
        let (body, signature) = sign_notice(&sent, &secret()).expect("signed");
        assert_eq!(verify_notice(&body, None, &secret(), NOW), Err(Refusal::Unsigned));
        let other = HandoffSecret::new(b"another group's secret").expect("secret");
        assert_eq!(verify_notice(&body, Some(&other.sign(&body)), &secret(), NOW), Err(Refusal::BadSignature));
        assert_eq!(verify_notice(&body, Some("v1=00"), &secret(), NOW), Err(Refusal::BadSignature));
        assert_eq!(verify_notice(&body, Some("sha1=abc"), &secret(), NOW), Err(Refusal::BadSignature));
        let mut tampered = body.clone();
        tampered[2] ^= 1;
        assert_eq!(verify_notice(&tampered, Some(&signature), &secret(), NOW), Err(Refusal::BadSignature));
        let late = NOW + MAX_NOTICE_AGE.as_millis() as u64 + 1;
        assert!(matches!(verify_notice(&body, Some(&signature), &secret(), late), Err(Refusal::Stale(_))));
        let early = NOW - MAX_NOTICE_AGE.as_millis() as u64 - 1;
        assert!(matches!(verify_notice(&body, Some(&signature), &secret(), early), Err(Refusal::Stale(_))));
    }

    #[test]
    fn bodies_that_are_not_notices_are_refused_with_their_reason() {
        let keys: Vec<String> = (0..=MAX_NOTICE_KEYS).map(|i| format!("s:shardId-{i}")).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let refused = |n: HandoffNotice| parse_notice(&serde_json::to_vec(&n).expect("json")).map(|_| ());
        assert_eq!(refused(notice("peer", NOW, &keys)), Err(Refusal::TooManyKeys(MAX_NOTICE_KEYS + 1)));
        assert!(refused(notice("peer", NOW, &keys[..MAX_NOTICE_KEYS])).is_ok(), "the most rows a notice names");
        assert_eq!(refused(notice("peer", NOW, &["#worker:peer"])).map_err(|e| e.reason()), Err("group_row"));
        assert_eq!(refused(notice("peer", NOW, &["s:1", "#term:discovery"])).map_err(|e| e.reason()), Err("group_row"));
        assert_eq!(refused(notice("peer", NOW, &["no-shard"])).map_err(|e| e.reason()), Err("bad_key"));
        assert_eq!(refused(notice("peer", NOW, &[])).map_err(|e| e.reason()), Err("malformed"));
        assert_eq!(refused(notice(&"x".repeat(10_000), NOW, &["s:1"])).map_err(|e| e.reason()), Err("malformed"));
        assert_eq!(parse_notice(b"{").map_err(|e| e.reason()), Err("malformed"));
        assert_eq!(parse_notice(&[b' '; MAX_BODY_BYTES + 1]).map_err(|e| e.reason()), Err("malformed"));
        // Foreign text in a refusal is cut: never a 10 KB key in a log line.
        let long = format!("#{}", "k".repeat(10_000));
        let text = parse_notice(&serde_json::to_vec(&notice("peer", NOW, &[&long])).expect("json"))
            .expect_err("refused")
            .to_string();
        assert!(text.len() < 160, "{text}");
    }

    #[test]
    fn senders_must_be_members_seen_alive_and_shares_count_without_the_leaver() {
        let mut handoffs = Handoffs::default();
        let leases: Vec<Lease> = (0..4).map(|i| lease(i, Some(if i < 2 { "me" } else { "leaver" }))).collect();
        let members = [member("me", None, true), member("leaver", None, true), member("dead", None, false)];
        handoffs.observe(&leases, &members, "me", Duration::from_secs(10));
        assert!(handoffs.seen_alive.contains_key("leaver") && !handoffs.seen_alive.contains_key("dead"));
        // Two workers, four rows: two each; without the leaver this worker's share is all four.
        assert_eq!(handoffs.allowance("me", "leaver", 2), 2);
        assert_eq!(handoffs.allowance("me", "stranger", 2), 0, "a stranger's leaving changes no share");
        // The leaver left the table (segmented scans leave first): still a member for a while.
        handoffs.observe(&leases, &members[..1], "me", Duration::from_secs(10));
        assert!(handoffs.seen_alive.contains_key("leaver"));
        handoffs.observe(&leases, &members[..1], "me", Duration::ZERO);
        assert!(!handoffs.seen_alive.contains_key("leaver"), "forgotten once not seen for a lease duration");
    }

    #[cfg(feature = "cli")]
    fn gate() -> (HandoffInbox, NoticeGate, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::default());
        let (inbox, gate) = inbox(None, secret(), metrics.clone());
        (inbox, gate, metrics)
    }

    #[cfg(feature = "cli")]
    #[test]
    fn answers_say_queued_refused_or_full_and_count_each_refusal() {
        let (inbox, gate, metrics) = gate();
        let (body, signature) =
            sign_notice(&notice("peer", NOW, &["s:shardId-000000000001"]), &secret()).expect("signed");
        assert_eq!(gate.answer(Some(&signature), &body, NOW).0, StatusCode::ACCEPTED);
        assert_eq!(gate.answer(Some(&signature), &body, NOW).0, StatusCode::UNAUTHORIZED, "a copy is refused");
        assert_eq!(gate.answer(None, &body, NOW).0, StatusCode::UNAUTHORIZED);
        let garbage = secret().sign(b"{");
        assert_eq!(gate.answer(Some(&garbage), b"{", NOW).0, StatusCode::BAD_REQUEST);
        drop(inbox);
        let (body, signature) =
            sign_notice(&notice("peer", NOW + 1, &["s:shardId-000000000001"]), &secret()).expect("signed");
        assert_eq!(gate.answer(Some(&signature), &body, NOW).0, StatusCode::SERVICE_UNAVAILABLE);
        let text = metrics.health().metrics_text().expect("metrics");
        for reason in ["replayed", "unsigned", "malformed", "busy"] {
            let series = format!("leasehold_handoff_notices_total{{event=\"refused\",reason=\"{reason}\"}} 1");
            assert!(text.contains(&series), "{series} in\n{text}");
        }
    }

    #[cfg(feature = "cli")]
    #[tokio::test]
    async fn a_notice_posted_reaches_the_inbox_and_garbage_is_refused() {
        let (mut inbox, gate, _) = gate();
        let route = route(gate);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(crate::health::serve_router_with(listener, route, stop.clone(), server_limits()));
        let notice = notice("me", now_ms(), &["s:shardId-000000000001"]);
        let sender = NoticeSender { secret: Some(secret()), ..NoticeSender::default() };
        sender.send(&address, &notice).await.expect("delivered");
        assert_eq!(inbox.notices.recv().await, Some(notice.clone()));
        let post = |body: Vec<u8>| {
            sender.client.request(
                Request::post(format!("http://{address}{NOTICE_PATH}"))
                    .body(Full::new(Bytes::from(body)))
                    .expect("request"),
            )
        };
        assert_eq!(post(b"{".to_vec()).await.expect("answered").status(), StatusCode::UNAUTHORIZED);
        let oversized = post(vec![b' '; MAX_BODY_BYTES + 1]).await.expect("answered");
        assert_eq!(oversized.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let unsigned = NoticeSender::default();
        assert!(unsigned.send(&address, &notice).await.is_err(), "no secret, no notice");
        drop(inbox);
        let again = HandoffNotice { sent_ms: now_ms() + 1, ..notice };
        assert!(sender.send(&address, &again).await.is_err(), "a closed inbox refuses notices");
        stop.cancel();
    }
}
