//! Handoff notices: a worker shutting down tells the peers it frees its leases for, over their HTTP
//! endpoints, which rows it released, so they take them at once instead of at their next scan (up to
//! a scan interval later). A notice is only a hint: the peer reads each row and takes it if it is
//! free, as a scan would; a notice lost on the way leaves the row to the scans, as before notices.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
#[cfg(feature = "cli")]
use http::StatusCode;
use http::{Request, header};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use tokio::task::JoinSet;

use super::Coordinator;
use crate::lease::{Lease, LeaseKey, Member};

/// Path of the endpoint that takes notices, beside `/metrics` on the same listener.
pub const NOTICE_PATH: &str = "/v1/handoff";

/// How long a releasing worker waits for a peer to take a notice: a notice later than a scan
/// interval is worth nothing.
const SEND_TIMEOUT: Duration = Duration::from_millis(500);

/// Notices waiting for the coordinator; more are refused (the scans find the rows anyway).
#[cfg(feature = "cli")]
const INBOX_CAPACITY: usize = 64;

/// What a releasing worker tells a peer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct HandoffNotice {
    /// The releasing worker.
    pub from: String,
    /// The rows it freed for this peer, as `lease_key` text.
    pub leases: Vec<String>,
}

/// The coordinator's end of the notice endpoint, and the address peers reach that endpoint at.
#[derive(Debug)]
pub struct HandoffInbox {
    pub(super) notices: mpsc::Receiver<HandoffNotice>,
    /// `host:port` written into this worker's membership row; `None` leaves peers to the scans.
    pub(crate) address: Option<String>,
}

/// A notice inbox advertised at `address`, and the sender its endpoint fills it through.
#[cfg(feature = "cli")]
pub fn inbox(address: Option<String>) -> (HandoffInbox, mpsc::Sender<HandoffNotice>) {
    let (sender, notices) = mpsc::channel(INBOX_CAPACITY);
    (HandoffInbox { notices, address }, sender)
}

/// The route (`POST` [`NOTICE_PATH`]) that fills an inbox through `sender`, to merge into the router
/// serving `/metrics`.
#[cfg(feature = "cli")]
pub fn route(sender: mpsc::Sender<HandoffNotice>) -> axum::Router {
    axum::Router::new().route(NOTICE_PATH, axum::routing::post(receive)).with_state(sender)
}

/// Answers a notice: 202 once queued for the coordinator, 400 for a body that is not one, 503 when the
/// coordinator takes no more (the scans find the rows anyway).
#[cfg(feature = "cli")]
fn answer(inbox: &mpsc::Sender<HandoffNotice>, body: &[u8]) -> (StatusCode, &'static str) {
    let Ok(notice) = serde_json::from_slice::<HandoffNotice>(body) else {
        return (StatusCode::BAD_REQUEST, "expected {\"from\": owner, \"leases\": [lease_key...]}");
    };
    match inbox.try_send(notice) {
        Ok(()) => (StatusCode::ACCEPTED, "accepted"),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "not taking notices"),
    }
}

#[cfg(feature = "cli")]
async fn receive(
    axum::extract::State(inbox): axum::extract::State<mpsc::Sender<HandoffNotice>>,
    body: Bytes,
) -> (StatusCode, &'static str) {
    answer(&inbox, &body)
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
/// serves no endpoint), the peers it would free its leases for, and the sender.
#[derive(Default)]
pub(super) struct Handoffs {
    pub(super) inbox: Option<HandoffInbox>,
    pub(super) peers: Peers,
    pub(super) sender: NoticeSender,
}

impl Handoffs {
    /// The next notice; never, without an inbox.
    pub(super) async fn next(&mut self) -> Option<HandoffNotice> {
        match &mut self.inbox {
            Some(inbox) => inbox.notices.recv().await,
            None => std::future::pending().await,
        }
    }
}

/// Sends notices to peers' endpoints.
#[derive(Clone)]
pub(super) struct NoticeSender {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for NoticeSender {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(SEND_TIMEOUT));
        Self { client: Client::builder(TokioExecutor::new()).build(connector) }
    }
}

impl NoticeSender {
    /// Tells the peer at `address` that `notice`'s rows are free for it; the error says why it did not
    /// take the notice (the rows are then found by the scans).
    pub(super) async fn send(&self, address: &str, notice: &HandoffNotice) -> Result<(), String> {
        let body = serde_json::to_vec(notice).map_err(|e| e.to_string())?;
        let request = Request::post(format!("http://{address}{NOTICE_PATH}"))
            .header(header::CONTENT_TYPE, "application/json")
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
    /// have been taken by a scan meanwhile) and its parents finished.
    pub(super) async fn take_noticed(&mut self, notice: HandoffNotice) {
        self.metrics().handoff_noticed("received");
        tracing::info!(from = notice.from, leases = notice.leases.len(), "handoff notice received");
        // A draining worker takes nothing, however it hears of a free row (its last plan said so).
        if self.settings.assigned.is_some() || self.share.2 {
            return;
        }
        for text in notice.leases {
            let Some(key) = LeaseKey::parse(&text) else {
                tracing::warn!(row = text, from = notice.from, "handoff notice names no lease row; ignored");
                continue;
            };
            if self.running.contains_key(&key) {
                continue;
            }
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

    /// Which peer each held lease is freed for at shutdown (see [`Peers::assign`]).
    pub(super) fn notice_plan(&self) -> HashMap<LeaseKey, String> {
        if self.settings.assigned.is_some() {
            return HashMap::new();
        }
        self.handoffs.peers.assign(self.running.keys().cloned())
    }

    /// Tells the peer at `address` that `key` is free, on `sending` (awaited before the process ends).
    pub(super) fn notify(&self, key: &LeaseKey, address: String, sending: &mut JoinSet<()>) {
        let notice = HandoffNotice { from: self.owner().to_string(), leases: vec![key.to_string()] };
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
        Member { owner: owner.into(), counter: 1, alive, address: address.map(str::to_string), draining: false }
    }

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

    #[cfg(feature = "cli")]
    #[test]
    fn answers_say_queued_malformed_or_full() {
        let (inbox, sender) = inbox(None);
        let notice = br#"{"from": "me", "leases": ["s:shardId-000000000001"]}"#;
        assert_eq!(answer(&sender, notice).0, StatusCode::ACCEPTED);
        assert_eq!(answer(&sender, b"{").0, StatusCode::BAD_REQUEST);
        drop(inbox);
        assert_eq!(answer(&sender, notice).0, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[cfg(feature = "cli")]
    #[tokio::test]
    async fn a_notice_posted_reaches_the_inbox_and_garbage_is_refused() {
        let (mut inbox, sender) = inbox(None);
        let route = route(sender);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        tokio::spawn(async move { axum::serve(listener, route).await });
        let notice = HandoffNotice { from: "me".into(), leases: vec!["s:shardId-000000000001".into()] };
        let sender = NoticeSender::default();
        sender.send(&address, &notice).await.expect("delivered");
        assert_eq!(inbox.notices.recv().await, Some(notice.clone()));
        let bad = sender.client.request(
            Request::post(format!("http://{address}{NOTICE_PATH}")).body(Full::new(Bytes::from("{"))).expect("request"),
        );
        assert_eq!(bad.await.expect("answered").status(), StatusCode::BAD_REQUEST);
        drop(inbox);
        assert!(sender.send(&address, &notice).await.is_err(), "a closed inbox refuses notices");
    }
}
