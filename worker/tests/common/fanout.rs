//! The fan-out test ground: the testkit's fan-out server in front of kinesalite, and worker configs
//! reading through it with `reader.mode: fanOut`.

use std::sync::OnceLock;
use std::time::Duration;

use leasehold_testkit::Service;
use leasehold_testkit::fanout::{FanOutControls, FanOutServer};

use super::{config_with_timing, with_endpoint};

/// Lease timing of the fan-out tests: a lease long enough to outlast the service's 5 s window in which
/// a shard's subscription answers ResourceInUseException (a shard is given up when no subscription
/// delivers within one lease), scans and checkpoints as fast as the other tests.
pub const FANOUT_TIMING: &str = "lease: {duration: 6s, renewInterval: 1s, scanInterval: 250ms, shardSyncInterval: 1s, \
                                 checkpointInterval: 200ms, gracefulTimeout: 3s}\n";

/// How long a fan-out test's subscription may be silent: three of the server's 1 s heartbeats.
pub const IDLE_TIMEOUT: &str = "3s";

/// A fan-out server in front of the shared kinesalite; fails the test when it cannot start.
pub async fn fan_out_server() -> FanOutServer {
    FanOutServer::start(&leasehold_testkit::endpoint(Service::Kinesis)).await.expect("fan-out server starts")
}

/// A worker config reading `stream` with enhanced fan-out through `server` (every Kinesis call goes
/// to it); `table` None means the memory store; `extra` is appended.
pub fn fan_out_config(server: &FanOutServer, stream: &str, table: Option<&str>, extra: &str) -> String {
    fan_out_config_at(&server.endpoint(), stream, table, FANOUT_TIMING, extra)
}

/// [`fan_out_config`] through the server at `endpoint`, with `timing` (a `lease:` line).
pub fn fan_out_config_at(endpoint: &str, stream: &str, table: Option<&str>, timing: &str, extra: &str) -> String {
    assert!(!extra.contains("reader:"), "a fan-out config brings its own reader line");
    let reader = format!("reader: {{mode: fanOut, subscriptionIdleTimeout: {IDLE_TIMEOUT}}}\n{extra}");
    let config = config_with_timing(stream, table, timing, &reader);
    with_endpoint(&config, Service::Kinesis, endpoint)
}

/// The fan-out server shared by the tests of one process that need no faults of their own (the
/// [`super::Emulator::FanOut`] ground): it runs on a runtime of its own, so it outlives each test's.
pub struct SharedFanOut {
    /// Its endpoint.
    pub endpoint: String,
    /// Its controls.
    pub controls: FanOutControls,
}

/// The process's [`SharedFanOut`], started on first use. Its resubscribe window is 1 s instead of the
/// service's 5 s: the shared-ground tests run with 2 s leases, within which a handed-over shard must
/// be subscribed again.
pub fn shared_fan_out() -> &'static SharedFanOut {
    static SHARED: OnceLock<SharedFanOut> = OnceLock::new();
    SHARED.get_or_init(|| {
        let (started, start) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("fan-out server runtime");
            runtime.block_on(async move {
                let server = fan_out_server().await;
                let controls = server.controls();
                controls.set_resubscribe_window(Duration::from_secs(1));
                started.send(SharedFanOut { endpoint: server.endpoint(), controls }).expect("test waits");
                std::future::pending::<()>().await
            })
        });
        start.recv().expect("the shared fan-out server starts")
    })
}
