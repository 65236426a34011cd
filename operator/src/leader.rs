//! Leader election on a coordination.k8s.io Lease, so several operator replicas can run and only one
//! reconciles. Written here because the crates that do it pin older kube versions; the protocol is the
//! one client-go uses: the holder renews `renewTime`; another candidate takes the Lease once
//! `renewTime + leaseDurationSeconds` has passed, with an update conditioned on the resourceVersion it
//! read, so two candidates can never both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

/// Leader election settings.
#[derive(Debug, Clone)]
pub struct Election {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This candidate's identity (the pod name).
    pub identity: String,
    /// How long a leader's claim lasts without renewal.
    pub lease_duration: Duration,
    /// How often the leader renews (and candidates retry).
    pub retry_period: Duration,
}

impl Election {
    /// Settings with client-go's usual timing: 15 s lease, renew every 2 s.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>, identity: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            retry_period: Duration::from_secs(2),
        }
    }
}

fn claim(election: &Election, previous: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
    let same_holder = previous.and_then(|p| p.holder_identity.as_deref()) == Some(election.identity.as_str());
    let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(election.identity.clone()),
        lease_duration_seconds: Some(i32::try_from(election.lease_duration.as_secs()).unwrap_or(i32::MAX)),
        acquire_time: if same_holder { previous.and_then(|p| p.acquire_time.clone()) } else { Some(MicroTime(now)) },
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(if same_holder { transitions } else { transitions + 1 }),
        ..LeaseSpec::default()
    }
}

/// True when `spec` is free for `identity` at `now`: no holder, our own, or expired.
fn claimable(spec: &LeaseSpec, identity: &str, now: Timestamp) -> bool {
    let holder = spec.holder_identity.as_deref().unwrap_or_default();
    if holder.is_empty() || holder == identity {
        return true;
    }
    let Some(MicroTime(renewed)) = &spec.renew_time else { return true };
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(15)));
    renewed.checked_add(duration).map(|expires| expires < now).unwrap_or(true)
}

/// A write of the Lease: true when it went through, false when another candidate wrote first (409).
fn won(write: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
    match write {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// One attempt to take or renew leadership; true when this candidate leads afterwards.
pub async fn try_lead(api: &Api<Lease>, election: &Election) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    match api.get_opt(&election.name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(election.name.clone()), ..ObjectMeta::default() },
                spec: Some(claim(election, None, now)),
            };
            won(api.create(&PostParams::default(), &lease).await)
        }
        Some(mut lease) => {
            let current = lease.spec.clone().unwrap_or_default();
            if !claimable(&current, &election.identity, now) {
                return Ok(false);
            }
            lease.spec = Some(claim(election, Some(&current), now));
            // The update carries the resourceVersion read above: a concurrent winner makes it fail.
            won(api.replace(&election.name, &PostParams::default(), &lease).await)
        }
    }
}

/// Gives leadership up at once (on shutdown) if this candidate holds it.
pub async fn step_down(api: &Api<Lease>, election: &Election) {
    if let Ok(Some(mut lease)) = api.get_opt(&election.name).await {
        let mut spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() == Some(election.identity.as_str()) {
            spec.holder_identity = None;
            spec.renew_time = None;
            lease.spec = Some(spec);
            let _ = api.replace(&election.name, &PostParams::default(), &lease).await;
        }
    }
}

/// Waits until this candidate leads (or `shutdown`), then keeps renewing; cancels `lost` if a renewal
/// fails for longer than the lease duration, so the caller stops reconciling before another leader
/// can start. Returns false if shut down before leading.
pub async fn lead(client: Client, election: Election, lost: CancellationToken, shutdown: CancellationToken) -> bool {
    let api = Api::<Lease>::namespaced(client, &election.namespace);
    loop {
        match try_lead(&api, &election).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "leader election attempt failed"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(election.retry_period) => {}
        }
    }
    tracing::info!(identity = election.identity, lease = election.name, "became leader");
    tokio::spawn(async move {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    step_down(&api, &election).await;
                    return;
                }
                _ = tokio::time::sleep(election.retry_period) => {}
            }
            match try_lead(&api, &election).await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => {
                    tracing::error!("leadership taken by another replica");
                    lost.cancel();
                    return;
                }
                Err(e) => tracing::warn!(error = %e, "leader renewal failed"),
            }
            // Stop before the claim could lapse, so two leaders never overlap.
            if last_renewal.elapsed() >= election.lease_duration.mul_f64(0.8) {
                tracing::error!("could not renew leadership in time");
                lost.cancel();
                return;
            }
        }
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_claimable_when_free_ours_or_expired() {
        let now = Timestamp::now();
        let held = |who: &str, ago: i64| LeaseSpec {
            holder_identity: Some(who.into()),
            renew_time: Some(MicroTime(now.checked_sub(SignedDuration::from_secs(ago)).unwrap())),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        };
        assert!(claimable(&LeaseSpec::default(), "a", now));
        assert!(claimable(&held("a", 1), "a", now));
        assert!(!claimable(&held("b", 1), "a", now));
        assert!(claimable(&held("b", 16), "a", now));
    }

    #[test]
    fn taking_over_counts_a_transition_and_renewing_does_not() {
        let now = Timestamp::now();
        let election = Election::new("ns", "leader", "a");
        let first = claim(&election, None, now);
        assert_eq!((first.holder_identity.as_deref(), first.lease_transitions), (Some("a"), Some(1)));
        let renewed = claim(&election, Some(&first), now);
        assert_eq!(renewed.lease_transitions, Some(1));
        assert_eq!(renewed.acquire_time, first.acquire_time);
        let other = claim(&Election::new("ns", "leader", "b"), Some(&renewed), now);
        assert_eq!(other.lease_transitions, Some(2));
    }
}
