//! Leader election on a real kube-apiserver: one leader at a time, handover on step-down and on expiry.

mod support;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use leasehold_operator::leader::{Election, lead, step_down, try_lead};
use tokio_util::sync::CancellationToken;

fn election(ns: &str, who: &str) -> Election {
    Election {
        lease_duration: Duration::from_secs(2),
        retry_period: Duration::from_millis(200),
        ..Election::new(ns, "leader", who)
    }
}

#[tokio::test]
async fn one_leader_at_a_time_with_handover_on_step_down_and_expiry() {
    let client = support::client().await;
    let ns = support::create_namespace(&client, "leader", false).await;
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);

    let (a, b) = (election(&ns, "a"), election(&ns, "b"));
    assert!(try_lead(&leases, &a).await.unwrap(), "a takes the free lease");
    assert!(!try_lead(&leases, &b).await.unwrap(), "b cannot while a holds it");
    assert!(try_lead(&leases, &a).await.unwrap(), "a renews");
    step_down(&leases, &a).await;
    assert!(try_lead(&leases, &b).await.unwrap(), "b takes it at once after a steps down");

    // b falls silent (crash): a waits out the lease duration, then takes over.
    assert!(!try_lead(&leases, &a).await.unwrap());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(try_lead(&leases, &a).await.unwrap(), "an expired claim is taken");
    assert_eq!(leases.get("leader").await.unwrap().spec.unwrap().lease_transitions, Some(3));

    // The long-running form: c leads and keeps renewing, d waits; when c shuts down, d leads.
    step_down(&leases, &a).await;
    let (c_lost, c_stop) = (CancellationToken::new(), CancellationToken::new());
    assert!(lead(client.clone(), election(&ns, "c"), c_lost.clone(), c_stop.clone()).await);
    let (d_lost, d_stop) = (CancellationToken::new(), CancellationToken::new());
    let d = tokio::spawn(lead(client.clone(), election(&ns, "d"), d_lost.clone(), d_stop.clone()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!d.is_finished(), "d must not lead while c renews");
    assert!(!c_lost.is_cancelled());
    c_stop.cancel();
    let led = tokio::time::timeout(Duration::from_secs(5), d).await.expect("d leads soon after c stops").unwrap();
    assert!(led);
    d_stop.cancel();
}
